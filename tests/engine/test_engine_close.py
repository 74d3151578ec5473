"""close() while other threads copy real bytes on the sim backend: every thread ends (its copies
land or fail with 'the engine is closed', never a hang), the bytes that landed are exact, and every
public call on the closed engine raises EngineError instead of reaching freed native memory."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from gpudash.engine import EngineConfig, EngineError, MemoryPool, TransferEngine
from gpudash.engine.pools import EnginePool

MiB = 2**20
THREADS = 8
ROUNDS = 5  # the race repeated on fresh engines, so that close() lands at many different moments
JOIN_S = 120.0  # generous: a thread still alive after this is hung, not slow
CLOSED = "the engine is closed"


def _copier(eng: TransferEngine, i: int, started: threading.Barrier, problems: list[str]) -> None:
    """Round trips host -> GPU -> host in every mode the engine has, checking the bytes, until the
    engine closes under it. Problems go to `problems` (an assert in a thread would go unseen)."""
    rng = np.random.default_rng(i)
    size = int(rng.integers(12 * MiB, 24 * MiB))  # above the fallback threshold: chunked over paths
    try:
        dev = eng.alloc_device(i % eng.num_gpus, size)
        src = rng.integers(0, 256, size, dtype=np.uint8)
        back = np.zeros(size, dtype=np.uint8)
    except EngineError as err:  # closed before this thread got going
        if CLOSED not in str(err):
            problems.append(f"thread {i}: {err}")
        started.abort()
        return
    try:
        started.wait()
    except threading.BrokenBarrierError:
        pass
    handles = []
    rounds = 0
    try:
        while True:
            n = size if rounds % 2 == 0 else int(rng.integers(1, 256 * 1024))  # multipath, then one chunk
            pageable = ("auto", "stage", "register", "driver")[rounds % 4]
            h = eng.copy(dev, src, nbytes=n, pageable=pageable)
            handles.append(h)
            h.wait()
            back[:n] = 0
            eng.copy(back, dev, nbytes=n, pageable=pageable, sync=rounds % 3 == 0).wait()
            if not np.array_equal(back[:n], src[:n]):
                problems.append(f"thread {i}: round {rounds} ({n} B, {pageable}) came back different")
            rounds += 1
            if rounds % 5 == 0:
                eng.stats()
                eng.now()
    except EngineError as err:
        if CLOSED not in str(err):
            problems.append(f"thread {i}: {err}")
    for h in handles:  # handles taken before close() finish with a result or EngineError, never hang
        try:
            h.wait(timeout=JOIN_S)
        except EngineError as err:
            if CLOSED not in str(err):
                problems.append(f"thread {i}: waiting after close: {err}")
    dev.free()  # freeing after close() is quiet: the engine gave its memory back itself


def test_close_while_eight_threads_copy_ends_every_thread(make_engine: Callable[..., TransferEngine]) -> None:
    for round_ in range(ROUNDS):
        eng = make_engine("8xh20")
        problems: list[str] = []
        started = threading.Barrier(THREADS + 1)
        threads = [threading.Thread(target=_copier, args=(eng, i, started, problems), daemon=True)
                   for i in range(THREADS)]
        for t in threads:
            t.start()
        started.wait()
        # close at a different moment of the copies in each round: after round_ stats reads
        for _ in range(round_):
            eng.stats()
        eng.close()
        for t in threads:
            t.join(JOIN_S)
        assert not [t.name for t in threads if t.is_alive()], f"round {round_}: threads hung after close()"
        assert not problems, f"round {round_}: {problems}"
        assert eng.closed
        _assert_every_public_call_raises(eng)


def test_close_from_two_threads_at_once_frees_once(make_engine: Callable[..., TransferEngine]) -> None:
    eng = make_engine("rtx5080+rtx3090")
    closers = [threading.Thread(target=eng.close) for _ in range(4)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in closers) and eng.closed
    eng.close()  # and once more, idempotent
    _assert_every_public_call_raises(eng)


# ---- every public call on a closed engine ----------------------------------------------------------
def _calls(eng: TransferEngine, dev: Any, host: np.ndarray) -> dict[str, Callable[[], Any]]:
    """One call of every public method of TransferEngine (close() aside, which stays idempotent)."""
    return {
        "copy": lambda: eng.copy(dev, host),
        "h2d": lambda: eng.h2d(dev, host),
        "d2h": lambda: eng.d2h(host, dev),
        "alloc_device": lambda: eng.alloc_device(0, MiB),
        "alloc_host": lambda: eng.alloc_host(MiB),
        "pools": lambda: eng.pools(),
        "set": lambda: eng.set(outstanding=3),
        "knobs": lambda: eng.knobs(),
        "now": lambda: eng.now(),
        "stats": lambda: eng.stats(),
        "topology": lambda: eng.topology(),
        "set_link": lambda: eng.set_link(0, gen=3),
        "inject_fault": lambda: eng.inject_fault(0),
    }


def _assert_every_public_call_raises(eng: TransferEngine) -> None:
    dev = np.zeros(MiB, dtype=np.uint8)  # stands in for a buffer of the engine; it is never reached
    host = np.zeros(MiB, dtype=np.uint8)
    wrong = []
    for name, call in _calls(eng, dev, host).items():
        try:
            call()
        except EngineError as err:
            if CLOSED not in str(err):
                wrong.append(f"{name}(): {err}")
        else:
            wrong.append(f"{name}() returned")
    assert not wrong, wrong


def test_the_closed_call_table_covers_every_public_method() -> None:
    """A public method added later must be added to _calls (and refuse a closed engine)."""
    public = {n for n, v in inspect.getmembers(TransferEngine) if not n.startswith("_") and inspect.isfunction(v)}
    table = set(_calls(None, None, np.zeros(1)))  # type: ignore[arg-type]
    assert public - {"close"} == table


def test_the_engine_pools_refuse_work_once_the_engine_closes(make_engine: Callable[..., TransferEngine]) -> None:
    eng = make_engine("8xh20")
    pools = eng.pools()
    host, relay = pools["engine-host"], pools["engine-gpu1"]
    block = host.alloc("staging", 4096)
    eng.close()
    assert all(isinstance(p, EnginePool) and p.closed and p.stats() == () for p in pools.values())
    for call in (lambda: host.alloc("staging", 4096), lambda: host.free(block), lambda: host.shard_stats("staging"),
                 lambda: host.unassigned, lambda: host.check(), lambda: relay.resize("relay", 64 * MiB),
                 lambda: relay.size_of(block)):
        with pytest.raises(EngineError, match="is closed"):
            call()
    with pytest.raises(EngineError, match=CLOSED):
        MemoryPool(MiB, engine=eng)  # a pool over a closed engine's memory
    with pytest.raises(EngineError, match=CLOSED):
        MemoryPool(MiB, engine=eng, gpu=0)


def test_a_pool_in_a_closed_engines_memory_refuses_work_and_still_closes(
        make_engine: Callable[..., TransferEngine]) -> None:
    eng = make_engine("rtx5080+rtx3090")
    pool = MemoryPool(4 * MiB, engine=eng, gpu=1, shards={"kv": 2 * MiB})
    block = pool.alloc("kv", 4096)
    eng.close()
    for call in (lambda: pool.alloc("kv", 4096), lambda: pool.free(block), lambda: pool.stats(),
                 lambda: pool.resize("kv", MiB), lambda: pool.unassigned):
        with pytest.raises(EngineError, match="closed with the engine whose memory it holds"):
            call()
    pool.close()  # gives nothing back twice: the engine already freed the slab
    assert pool.closed and pool.stats() == ()


def test_calls_after_close_do_not_crash_the_interpreter() -> None:
    """now() after close() used to segfault: in a child process, every call raises and it exits 0."""
    script = textwrap.dedent("""
        import numpy as np
        from gpudash.engine import EngineConfig, EngineError, TransferEngine
        eng = TransferEngine(EngineConfig(backend="sim", profile="h200"))
        dev = eng.alloc_device(0, 1 << 20)
        host = np.ones(1 << 20, dtype=np.uint8)
        eng.copy(dev, host, sync=True)
        eng.close()
        refused = 0
        for call in (eng.now, eng.stats, lambda: eng.copy(dev, host), lambda: eng.copy(dev, host, sync=True),
                     lambda: eng.d2h(host, dev), eng.topology, eng.knobs):
            for _ in range(3):
                try:
                    call()
                except EngineError as err:
                    assert "the engine is closed" in str(err), err
                    refused += 1
        dev.free()
        del dev, host
        print("refused", refused)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=JOIN_S)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    assert out.stdout.split() == ["refused", "21"]


def test_a_sim_engine_made_after_close_works(make_engine: Callable[..., TransferEngine]) -> None:
    """Closing frees one engine only: another one made afterwards moves bytes."""
    make_engine("h200").close()
    eng = TransferEngine(EngineConfig(backend="sim", profile="h200", sim_time_scale=1.0))
    try:
        dev = eng.alloc_device(0, MiB)
        src = np.arange(MiB, dtype=np.uint64).astype(np.uint8)
        back = np.zeros(MiB, dtype=np.uint8)
        eng.copy(dev, src, sync=True)
        eng.copy(back, dev, sync=True)
        assert np.array_equal(back, src)
    finally:
        eng.close()


# ---- the C ABI: ge_destroy while callers are blocked inside it ---------------------------------------
_C_SCRIPT = """
import ctypes, threading, time
import numpy as np
from gpudash.engine import _native as N

lib = N.lib()
MiB = 1 << 20
D = ctypes.c_double
eng = ctypes.c_void_p()
knobs = N.Knobs(4 * MiB, 4 * MiB, 12 * MiB, 12 * MiB, 2, 1, 2, 0)
# two GPUs with a peer path each way, slow links (0.1 GB/s at time scale 1): a 64 MiB copy takes ~0.7 s
rc = lib.ge_create_sim(2, (D * 2)(0.1, 0.1), (D * 2)(1.0, 1.0), (D * 4)(0, 50, 50, 0), 50.0, 1.0,
                       ctypes.byref(knobs), ctypes.byref(eng))
assert rc == 0, rc
n = 64 * MiB
src, dev0 = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)
dev1, back = np.random.default_rng(2).integers(0, 256, n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)
results = {}

def sync_copy(name, direction, gpu, dst, s, flags):
    desc = N.CopyDescC(direction, gpu, dst.ctypes.data, s.ctypes.data, n)
    out = (ctypes.c_uint64 * 2)()
    results[name] = lib.ge_copy_sync(eng, ctypes.byref(desc), flags, 0, out)

# direct: the synchronous fast path on GPU 0 (one 64 MiB chunk on the caller's thread);
# multipath: GPU 1 -> host over its direct path and the relay through GPU 0, waited for by the caller
threads = [threading.Thread(target=sync_copy, args=("direct", N.H2D, 0, dev0, src, N.HOST_DIRECT | N.COPY_DIRECT_ONLY)),
           threading.Thread(target=sync_copy, args=("multipath", N.D2H, 1, back, dev1, N.HOST_DIRECT))]
for t in threads:
    t.start()
paths = (N.PathStatsC * 8)()
links = (N.LinkStatsC * 2)()
busy = set()
deadline = time.monotonic() + 120
while busy != {"direct", "multipath"} and time.monotonic() < deadline:  # a path busy: its caller is inside
    lib.ge_stats(eng, paths, lib.ge_num_paths(eng), links, 2)
    for p in paths[:lib.ge_num_paths(eng)]:
        if p.queue_depth and p.gpu == 0 and p.direction == N.H2D and p.via == 0:
            busy.add("direct")
        if p.queue_depth and p.gpu == 1 and p.direction == N.D2H:
            busy.add("multipath")
    time.sleep(0.001)
assert busy == {"direct", "multipath"}, busy
lib.ge_destroy(eng)  # returns only once both callers have left the engine
for t in threads:
    t.join(120)
assert not any(t.is_alive() for t in threads)
print(results["direct"], results["multipath"], bool((dev0 == src).all()))
"""


def test_ge_destroy_waits_for_callers_blocked_in_synchronous_copies() -> None:
    """ge_destroy while one thread is inside the synchronous fast path and another waits for a multipath
    copy: both return (the fast-path copy lands byte-exact, the other lands or reports GE_ECLOSED) and
    the process does not crash (the engine is freed only after they left)."""
    out = subprocess.run([sys.executable, "-c", _C_SCRIPT], capture_output=True, text=True, timeout=JOIN_S * 3)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    direct, multipath, exact = out.stdout.split()
    assert (int(direct), exact) == (0, "True")
    assert int(multipath) in (0, -9)  # GE_OK or GE_ECLOSED
