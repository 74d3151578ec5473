"""Every bad input ends in an exception naming the argument and the limit; nothing is half-applied and
the engine keeps working afterwards."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from gpudash.engine import EngineArgumentError, EngineConfig, EngineError, TransferEngine

MiB = 2**20


@pytest.fixture
def eng(make_engine: Callable[..., TransferEngine]) -> TransferEngine:
    return make_engine("rtx5080+rtx3090", sim_time_scale=1.0)


def test_sizes(eng: TransferEngine) -> None:
    dev = eng.alloc_device(0, 1000)
    with pytest.raises(EngineArgumentError, match=r"dst is too small: it holds 1000 bytes and the copy needs 1001"):
        eng.copy(dev, np.zeros(1001, dtype=np.uint8))
    with pytest.raises(EngineArgumentError, match=r"src is too small: it holds 10 bytes and the copy needs 500"):
        eng.copy(dev, np.zeros(10, dtype=np.uint8), nbytes=500)
    with pytest.raises(EngineArgumentError, match=r"nbytes must be an integer >= 0, got -1"):
        eng.copy(dev, np.zeros(10, dtype=np.uint8), nbytes=-1)
    with pytest.raises(EngineArgumentError, match=r"nbytes must be an integer >= 0, got True"):
        eng.copy(dev, np.zeros(10, dtype=np.uint8), nbytes=True)
    with pytest.raises(EngineArgumentError, match=r"dst is too small: it holds 1000 bytes"):
        eng.copy(dev.ptr, np.zeros(2000, dtype=np.uint8), nbytes=2000)  # raw device pointer, known extent
    with pytest.raises(EngineArgumentError, match=r"pass nbytes="):
        eng.copy(dev.ptr, np.zeros(10, dtype=np.uint8))
    with pytest.raises(EngineArgumentError, match=r"nbytes must be a positive integer, got 0"):
        eng.alloc_device(0, 0)
    assert eng.copy(dev, np.zeros(10, dtype=np.uint8), nbytes=0).wait().chunks == 0


def test_overlap_contiguity_readonly_and_kinds(eng: TransferEngine) -> None:
    dev = eng.alloc_device(0, 4096)
    host = eng.alloc_host(4096)
    with pytest.raises(EngineArgumentError, match="dst and src overlap"):
        eng.copy(dev.ptr + 100, dev.ptr, nbytes=200)
    with pytest.raises(EngineArgumentError, match="src is not contiguous"):
        eng.copy(dev, np.zeros(8192, dtype=np.uint8)[::2])
    with pytest.raises(EngineArgumentError, match="dst is not contiguous"):
        eng.copy(np.zeros((64, 64), dtype=np.uint8).T, dev)
    with pytest.raises(EngineArgumentError, match="dst is read-only"):
        eng.copy(bytes(4096), dev)
    with pytest.raises(EngineArgumentError, match="both host memory"):
        eng.copy(host, np.zeros(4096, dtype=np.uint8))
    with pytest.raises(EngineArgumentError, match="both GPU memory"):
        eng.copy(dev, eng.alloc_device(1, 4096))
    with pytest.raises(EngineArgumentError, match="src must be a numpy/CuPy array.*got list"):
        eng.copy(dev, [1, 2, 3])
    with pytest.raises(EngineArgumentError, match="h2d\\(\\): src_host is GPU memory"):
        eng.h2d(host, dev)
    with pytest.raises(EngineArgumentError, match="d2h\\(\\): dst_host is GPU memory"):
        eng.d2h(dev, host)
    with pytest.raises(EngineArgumentError, match="stream= needs backend='cuda'"):
        eng.copy(dev, host, stream=1)


def test_devices_and_freed_buffers(eng: TransferEngine) -> None:
    with pytest.raises(EngineArgumentError, match=r"gpu=2 does not exist; this engine has 2 GPU\(s\), numbered 0..1"):
        eng.alloc_device(2, 4096)
    with pytest.raises(EngineArgumentError, match=r"gpu=-1 does not exist"):
        eng.set_link(-1, 3)
    dev = eng.alloc_device(1, 16 * MiB)
    dev.free()
    with pytest.raises(EngineArgumentError, match="dst is a freed DeviceBuffer"):
        eng.copy(dev, np.zeros(16, dtype=np.uint8))
    with pytest.raises(EngineArgumentError, match="host_view.*freed|was freed"):
        dev.host_view()
    busy = eng.alloc_device(1, 64 * MiB)
    eng.set_link(1, 1, 1)  # 0.2 GB/s: the copy takes a while
    h = eng.copy(busy, eng.alloc_host(64 * MiB))
    with pytest.raises(EngineArgumentError, match="used by a copy in flight"):
        busy.free()
    h.wait()
    busy.free()


def test_knobs_out_of_range_change_nothing(eng: TransferEngine) -> None:
    before = eng.knobs()
    cases = [
        ({"outstanding": 0}, r"knob outstanding=0 is out of range; it must be in \[1, 64\]"),
        ({"h2d_chunk_bytes": 100}, r"knob h2d_chunk_bytes=100 is out of range; it must be in \[4096, 1073741824\]"),
        ({"staging_threads": 65}, r"knob staging_threads=65 .*\[1, 64\]"),
        ({"d2h_fallback_bytes": -5}, r"knob d2h_fallback_bytes=-5 is out of range"),
        ({"direct_first": 1}, r"knob direct_first must be True or False"),
        ({"outstanding": 2.5}, r"knob outstanding must be an integer"),
        ({"bogus": 1}, r"unknown knob 'bogus'"),
        ({"outstanding": 8, "d2h_chunk_bytes": 10**10}, r"knob d2h_chunk_bytes"),
    ]
    for knobs, message in cases:
        with pytest.raises(EngineArgumentError, match=message):
            eng.set(**knobs)
        assert eng.knobs() == before, f"{knobs} was half-applied"
    with pytest.raises(ValueError):  # EngineArgumentError is a ValueError too
        eng.set(outstanding=100)


def test_bad_config_link_and_fault_arguments(eng: TransferEngine) -> None:
    with pytest.raises(EngineArgumentError, match="unknown sim profile 'nope'"):
        EngineConfig(profile="nope")
    with pytest.raises(EngineArgumentError, match="backend must be 'sim' or 'cuda'"):
        EngineConfig(backend="rocm")
    with pytest.raises(EngineArgumentError, match=r"knob outstanding=99 is out of range"):
        EngineConfig(outstanding=99)
    with pytest.raises(EngineArgumentError, match=r"gen=5 is out of range for GPU 0; it must be in \[1, 4\]"):
        eng.set_link(0, gen=5)
    with pytest.raises(EngineArgumentError, match=r"width=3 is not valid for GPU 0"):
        eng.set_link(0, width=3)
    with pytest.raises(EngineArgumentError, match="there is no path from GPU 1 to GPU 0"):
        eng.inject_fault(0, via=1)
    with pytest.raises(EngineArgumentError, match="direction must be 'h2d' or 'd2h'"):
        eng.inject_fault(0, direction="up")


def test_cuda_backend_without_driver_is_a_clean_error() -> None:
    try:
        eng = TransferEngine(EngineConfig(backend="cuda"))
    except EngineError as err:
        assert err.name in ("GE_ENOCUDA", "GE_ENODEV") or err.name.startswith("CUDA_ERROR")
        assert "creating the cuda engine failed" in str(err)
    else:  # a machine with a GPU
        eng.close()


def test_closed_engine_refuses_work(make_engine: Callable[..., TransferEngine]) -> None:
    eng = make_engine("h200")
    eng.close()
    with pytest.raises(EngineError, match="the engine is closed"):
        eng.stats()
    eng.close()  # idempotent


def test_results_are_frozen_and_typed(eng: TransferEngine) -> None:
    st = eng.stats()
    assert isinstance(st.paths, tuple) and isinstance(st.links, tuple)
    p = st.paths[0]
    assert (type(p.name), type(p.bytes), type(p.gbps), p.direction) == (str, int, float, "h2d")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.bytes = 1  # type: ignore[misc]
    topo = eng.topology()
    assert topo.backend == "sim" and topo.paths == ("direct:0", "direct:1")
    assert topo.peer == ((None, None), (None, None))
    assert set(st.knobs) == set(eng.knob_names)
