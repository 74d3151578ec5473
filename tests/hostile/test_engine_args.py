"""The transfer engine's public API against hostile arguments: an object-dtype numpy array (its bytes are
Python object pointers) is refused as either side of a copy, and absurd allocation sizes, or more device
memory than the simulated GPU has, end in EngineError rather than MemoryError, ValueError or a crash.
The crash-prone cases run in a child interpreter, so a segfault fails the test instead of the suite."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpudash.engine import EngineConfig, TransferEngine
from gpudash.engine.errors import EngineError
from gpudash.engine.profiles import PROFILES

OBJECT_COPY = """
import numpy as np
from gpudash.engine import EngineConfig, TransferEngine
from gpudash.engine.errors import EngineArgumentError
eng = TransferEngine(EngineConfig(backend="sim", profile="h200"))
dev = eng.alloc_device(0, 1 << 20)
dev.host_view()[:] = 0xAB
objects = np.empty(1 << 17, dtype=object)  # 1 MiB of PyObject pointers
for direction in ("d2h", "h2d"):
    try:
        eng.d2h(objects, dev, 1 << 20) if direction == "d2h" else eng.h2d(dev, objects, 1 << 20)
    except EngineArgumentError as err:
        print(direction, "refused:", err)
print(sum(1 for o in objects if o is not None), "objects changed")
dev.free()
eng.close()
"""


def test_an_object_dtype_array_is_refused_as_either_side_of_a_copy() -> None:
    r = subprocess.run([sys.executable, "-c", OBJECT_COPY], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"rc {r.returncode}: {r.stderr[-2000:]}"
    assert "d2h refused:" in r.stdout and "h2d refused:" in r.stdout and "dtype object" in r.stdout
    assert "0 objects changed" in r.stdout


@pytest.fixture
def sim_engine():
    eng = TransferEngine(EngineConfig(backend="sim", profile="rtx5080+rtx3090"))
    yield eng
    eng.close()


@pytest.mark.parametrize("nbytes", [2**62, 2**64, 2**70, 10**30])
def test_an_absurd_allocation_is_an_engine_error(sim_engine, nbytes: int) -> None:
    for alloc in (lambda: sim_engine.alloc_device(0, nbytes), lambda: sim_engine.alloc_host(nbytes)):
        with pytest.raises(EngineError):
            alloc()


def test_the_simulated_gpu_holds_no_more_than_its_memory(sim_engine) -> None:
    card = PROFILES["rtx5080+rtx3090"].gpus[0].memory_bytes  # the 16 GB RTX 5080
    with pytest.raises(EngineError, match="GPU 0"):
        sim_engine.alloc_device(0, card + 2**30)
    first = sim_engine.alloc_device(0, card // 2)
    with pytest.raises(EngineError, match="GPU 0"):
        sim_engine.alloc_device(0, card // 2 + 2**30)  # together they pass the card's memory
    first.free()
    sim_engine.alloc_device(0, card // 2 + 2**30).free()  # the freed half is available again
