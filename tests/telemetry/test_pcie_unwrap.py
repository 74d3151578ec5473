"""Unwrapping 32-bit PCIe byte counters (pure logic, fed synthetic wrapping sequences)."""

from __future__ import annotations

import random
import time

from gpudash.telemetry.pcie_counters import (COUNTER_MODULUS, CounterPoller, CounterTotals, CounterUnwrapper,
                                             TickRates, next_interval, rates)

M = COUNTER_MODULUS


def test_unwrapper_recovers_totals_across_many_wraps() -> None:
    rng = random.Random(7)
    true_total, raw = 0, M - 1000  # start just below a wrap
    u = CounterUnwrapper()
    u.update(raw)
    for _ in range(10_000):
        step = rng.randrange(0, M - 1)  # anything below one full wrap between reads
        true_total += step
        raw = (raw + step) % M
        assert u.update(raw) == true_total
    assert true_total > 1000 * M  # it really wrapped many times


def test_unwrapper_first_read_is_zero_and_widens_for_64_bit_counters() -> None:
    u = CounterUnwrapper()
    assert u.update(12345) == 0
    assert u.update(M + 5) == M + 5 - 12345 and u.modulus == 2**64
    assert u.update(M + 10) == M + 10 - 12345


def test_next_interval_keeps_four_fold_headroom() -> None:
    assert next_interval(0, M, 0.005, 0.25) == 0.25  # idle: slow
    at_55 = next_interval(55e9, M, 0.001, 0.25)  # H200 gen5 x16 wire rate
    assert abs(at_55 - 0.25 * M / 55e9) < 1e-12 and at_55 * 55e9 * 4 <= M
    assert next_interval(1e15, M, 0.005, 0.25) == 0.005


def test_poller_totals_and_rates_with_a_fake_clock() -> None:
    now = [100.0]
    counts = [0, 0]  # true TX / RX bytes

    def read() -> tuple[int, int]:
        return counts[0] % M, counts[1] % M

    p = CounterPoller([read], clock=lambda: now[0])
    p.read_all()
    first = p.totals()[0]
    for _ in range(50):  # 50 reads 40 ms apart at 60 GB/s TX (wraps every ~72 ms), 1 GB/s RX
        now[0] += 0.04
        counts[0] += int(60e9 * 0.04)
        counts[1] += int(1e9 * 0.04)
        fastest = p.read_all()
    last = p.totals()[0]
    assert isinstance(last, CounterTotals) and last.tx == counts[0] and last.rx == counts[1]
    assert abs(fastest - 60e9) < 1e3
    tx, rx = rates(first, last, scale=1 / 1.09)
    assert abs(tx - 60e9 / 1.09) / tx < 1e-6 and abs(rx - 1e9 / 1.09) / rx < 1e-6
    assert rates(last, last, 1.0) is None


def test_poller_thread_idles_slowly() -> None:
    reads = [0]

    def read() -> tuple[int, int] | None:
        reads[0] += 1
        return None if reads[0] == 2 else (reads[0], reads[0])  # one failed read is skipped

    p = CounterPoller([read], min_interval_s=0.005, max_interval_s=0.2)
    p.start()
    time.sleep(0.45)
    p.stop()
    assert 2 <= p.reads <= 4  # one read every 0.2 s while the counters barely move (quiet: no second read)
    assert p.interval_s == 0.2 and p.totals()[0] is not None


def test_poller_thread_confirms_a_busy_looking_read() -> None:
    """At 1 GB/s (above the quiet rate, too slow to shorten the interval) every idle-interval read gets
    its short confirming read: pairs of reads, where a quiet counter gets one."""
    t0 = time.monotonic()

    def read() -> tuple[int, int]:
        return int(1e9 * (time.monotonic() - t0)) % M, 0

    p = CounterPoller([read], min_interval_s=0.005, max_interval_s=0.2, quiet_bps=256e6)
    p.start()
    time.sleep(0.45)
    p.stop()
    assert p.interval_s == 0.2
    assert 5 <= p.reads <= 8  # the start's read, then a pair every 0.2 s


def test_poller_thread_escapes_aliasing_when_a_burst_starts() -> None:
    """A counter at 40 GB/s wraps every 107 ms: read every 0.25 s its deltas alias to a small rate.
    The short probe read notices the real rate and the poller speeds up, so totals become exact."""
    rate_bps, t0 = 40e9, time.monotonic()

    def read() -> tuple[int, int]:
        n = int(rate_bps * (time.monotonic() - t0))
        return n % M, 0

    p = CounterPoller([read], min_interval_s=0.005, max_interval_s=0.25)
    p.start()
    time.sleep(0.6)  # first (blind) idle interval, then the poller has sped up
    a = p.totals()[0]
    time.sleep(0.6)
    b = p.totals()[0]
    p.stop()
    assert p.interval_s < 0.03
    tx, _ = rates(a, b, 1.0)
    assert abs(tx - rate_bps) / rate_bps < 0.02


def test_tick_rates_repeat_when_the_poller_has_not_read_since_the_last_tick() -> None:
    tr = TickRates([0.5, 1.0])
    a0, b0 = CounterTotals(1.0, 0, 0), None
    assert tr.update([a0, b0]) == [None, None]  # one read: no rate yet, not a made-up zero
    a1, b1 = CounterTotals(2.0, 100, 300), CounterTotals(2.0, 7, 7)
    assert tr.update([a1, b1]) == [(50.0, 150.0), None]
    assert tr.update([a1, b1]) == [(50.0, 150.0), None]  # no new read: previous rate repeated
    a2, b2 = CounterTotals(4.0, 100, 500), CounterTotals(3.0, 17, 27)
    assert tr.update([a2, b2]) == [(0.0, 50.0), (10.0, 20.0)]
