"""The PCIe counter poll rate follows the traffic (issue 46): driven round by round on a fake clock, over a fake
link whose 32-bit wire counter wraps exactly as NVML's does (the true byte count modulo 2**32), the poller reads
fast only while the counter moves fast enough to wrap, every `max_interval_s` on a link that barely moves, and
every `idle_interval_s` once the link has been quiet for `settle_s`; its totals stay exact wherever it reads
fast enough, and a burst after a long quiet spell is caught within one idle interval."""

from __future__ import annotations

from gpudash.telemetry.pcie_counters import COUNTER_MODULUS as M
from gpudash.telemetry.pcie_counters import CounterPoller


class FakeLink:
    """Bytes moved by rate segments [(start_s, bytes_per_s), ...]; read() is NVML's (TX, RX) wire counters."""

    def __init__(self, clock: list[float], segments: list[tuple[float, float]]) -> None:
        self.clock, self.segments, self.reads = clock, segments, 0

    def moved(self, t: float) -> int:
        total = 0.0
        for i, (start, rate) in enumerate(self.segments):
            end = self.segments[i + 1][0] if i + 1 < len(self.segments) else float("inf")
            if t > start:
                total += rate * (min(t, end) - start)
        return int(total)

    def read(self) -> tuple[int, int]:
        self.reads += 1
        return self.moved(self.clock[0]) % M, 0


def _drive(link: FakeLink, clock: list[float], until: float, **kw) -> tuple[CounterPoller, list[tuple[float, float]]]:
    """Run the poller's rounds on the fake clock until `until`; [(time, interval chosen)] per round."""
    def sleep(s: float) -> None:
        clock[0] += s

    p = CounterPoller([link.read], clock=lambda: clock[0], sleep=sleep, **kw)
    p.read_all()
    rounds = []
    while clock[0] < until:
        interval = p.step()
        rounds.append((clock[0], interval))
        clock[0] += interval
    return p, rounds


KW = dict(min_interval_s=0.005, max_interval_s=0.5, idle_interval_s=2.0, settle_s=30.0, quiet_bps=256e6)


def test_an_idle_link_is_read_every_idle_interval_once_it_has_settled() -> None:
    clock = [0.0]
    link = FakeLink(clock, [(0.0, 1e3)])  # a few KB/s of housekeeping
    p, rounds = _drive(link, clock, 120.0, **KW)
    assert {iv for t, iv in rounds if t < 30.0} == {0.5}
    assert {iv for t, iv in rounds if t >= 30.5} == {2.0}
    assert link.reads <= 30 / 0.5 + 90 / 2.0 + 3  # 2 reads a second at first, one every 2 s once settled
    assert p.totals()[0].tx == link.moved(clock[0] - rounds[-1][1])


def test_a_fast_link_is_read_before_its_counter_can_wrap_and_its_total_is_exact() -> None:
    """55 GB/s wraps the 32-bit counter every 78 ms: once the poller has seen the rate (its first interval is
    the blind spot the module's doc names), each read comes within a quarter of that and no wrap is missed."""
    clock = [0.0]
    rate = 55e9
    link = FakeLink(clock, [(0.0, rate)])
    p, _ = _drive(link, clock, 1.0, **KW)
    first = p.totals()[0]
    p_rounds = []
    while clock[0] < 10.0:
        p_rounds.append(p.step())
        clock[0] += p_rounds[-1]
    last = p.totals()[0]
    assert max(p_rounds) * rate <= M / 4 + 1
    assert last.tx - first.tx == link.moved(last.t) - link.moved(first.t)  # every byte in between counted


def test_a_burst_after_a_long_quiet_spell_is_caught_within_one_idle_interval() -> None:
    clock = [0.0]
    link = FakeLink(clock, [(0.0, 0.0), (100.0, 40e9), (130.0, 0.0)])
    p, rounds = _drive(link, clock, 200.0, **KW)
    during = [(t, iv) for t, iv in rounds if 100.0 <= t < 130.0]
    caught = next(t for t, iv in during if iv < 0.05)
    assert caught <= 100.0 + 2.0 + 0.01  # the first read after the burst began, plus its short confirming read
    fast = [(t, iv) for t, iv in during if t > caught]
    assert fast and all(iv * 40e9 <= M / 4 + 1 for _, iv in fast)
    # after the burst: the short interval until the link has been quiet for settle_s again, then the idle one
    after = [(t, iv) for t, iv in rounds if t >= 131.0]
    assert {iv for t, iv in after if t < 159.0} == {0.5} and {iv for t, iv in after if t >= 161.0} == {2.0}
