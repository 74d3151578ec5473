"""What starting a program under libgpudash_preload.so needs, and nothing more: where the library is, the
environment that starts the program under it (see shm.py for what each variable means), and where the
program's shared-memory blocks will be. `gpudash run` and the supervisor build a program's environment from
here before they start it; the block layouts and their readers (shm.py) pull in the engine's results and
numpy, which only matter once the program runs."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, Mapping

from gpudash.engine import _native as N
from gpudash.engine.config import KNOB_TABLE, validate_knobs
from gpudash.engine.errors import EngineArgumentError, EngineError

PRELOAD_LIB_NAME = "libgpudash_preload.so"
PRELOAD_LIB_ENV = "GPUDASH_PRELOAD_LIB"
SWITCH_ENV = "GPUDASH_PRELOAD"
NAME_ENV = "GPUDASH_PRELOAD_NAME"
KNOBS_ENV = "GPUDASH_PRELOAD_KNOBS"
KEEP_FOR_ENV = "GPUDASH_PRELOAD_KEEP_FOR"  # a pid: when it is the process's parent, the blocks stay at exit

SHM_DIR = Path("/dev/shm")  # where glibc's shm_open puts "/name" segments
STATS_PREFIX = "gpudash-preload-stats-"
KNOBS_PREFIX = "gpudash-preload-knobs-"

# The knobs a preloaded engine has: the native struct's, plus the pageable staging thresholds.
# A preloaded engine takes the live knobs of the one knob table (gpudash/engine/config.py).
PRELOAD_KNOBS = tuple(k.name for k in KNOB_TABLE if k.live)


class PreloadLibraryMissing(EngineError):
    """libgpudash_preload.so is not installed or built."""


def preload_library() -> Path:
    """The newest libgpudash_preload.so: $GPUDASH_PRELOAD_LIB, beside the engine library (wheel,
    editable install) or in the repository's build/ tree."""
    env = os.environ.get(PRELOAD_LIB_ENV)
    if env:
        if not Path(env).is_file():
            raise PreloadLibraryMissing(f"{PRELOAD_LIB_ENV}={env} is not a file; unset it or point it at "
                                        f"{PRELOAD_LIB_NAME}", N.ENOTSUP, "GE_ENOTSUP")
        return Path(env).resolve()
    found = [p for p in N._candidates(PRELOAD_LIB_NAME, PRELOAD_LIB_ENV) if p.is_file()]
    if not found:
        raise PreloadLibraryMissing(
            f"the preload library {PRELOAD_LIB_NAME} was not found; build it with `pip install .` or "
            f"`cmake -S . -B build/dev && cmake --build build/dev`, or set {PRELOAD_LIB_ENV}",
            N.ENOTSUP, "GE_ENOTSUP")
    return max(found, key=lambda p: p.stat().st_mtime).resolve()


def preload_knobs(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of engine settings a preloaded engine has (e.g. not the registration cache's cap)."""
    return {k: v for k, v in settings.items() if k in PRELOAD_KNOBS}


def encode_knobs(knobs: Mapping[str, Any]) -> str:
    """GPUDASH_PRELOAD_KNOBS's value for `knobs` (validated; booleans as 1/0)."""
    other = sorted(set(knobs) - set(PRELOAD_KNOBS))
    if other:
        raise EngineArgumentError(f"knob {', '.join(other)} does not apply to a preloaded process; its knobs "
                                  f"are: {', '.join(PRELOAD_KNOBS)}")
    checked = validate_knobs(dict(knobs))
    return ",".join(f"{k}={int(v)}" for k, v in checked.items())


def preload_env(base: Mapping[str, str], name: str, knobs: Mapping[str, Any],
                library: Path | None = None) -> dict[str, str]:
    """`base` with the preload library first in LD_PRELOAD (once), the server's name and the start-up
    knobs; raises PreloadLibraryMissing or EngineArgumentError before anything is started."""
    lib = library or preload_library()
    env = dict(base)
    kept = [p for p in re.split(r"[: ]+", env.get("LD_PRELOAD", "")) if p and Path(p).name != PRELOAD_LIB_NAME]
    env["LD_PRELOAD"] = ":".join([str(lib), *kept])
    env[NAME_ENV] = name
    value = encode_knobs(knobs)
    if value:
        env[KNOBS_ENV] = value
    else:
        env.pop(KNOBS_ENV, None)
    return env


def odd_entry(st: os.stat_result) -> str | None:
    """Why an entry is not a block of this user's processes (None: it may be one)."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    return None
