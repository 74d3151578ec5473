"""PCIe byte counters that wrap: unwrap them into 64-bit totals and turn totals into rates.

NVML's PCIe TX/RX byte-counter fields are 32-bit and count *wire* bytes (payload plus TLP/DLLP
overhead). At full speed on PCIe 5.0 x16 they wrap every ~75 ms, so deltas taken once per tick are
meaningless. `CounterPoller` reads them in the background often enough that at most one wrap happens
between reads (the interval adapts to the last observed rate, and stretches out when the box is idle
so an idle box costs almost nothing); the sampler's tick only reads the accumulated totals.

While idle the poller wakes every `max_interval_s` and reads; when that read moved faster than
`quiet_bps`, a second read `min_interval_s` later measures a rate too short to alias, so a burst is
seen within one idle interval and the poller speeds up. A quiet read is trusted without the second
one: each read costs ~0.8 ms of CPU on an H200 (the driver asks the GPU's firmware), and an aliased
burst looks quiet with a chance of only quiet_bps * max_interval_s / modulus (1.5% at 256 MB/s and
0.25 s) per interval, so it is caught one interval later instead.
Blind spot, by design: a burst that jumps from idle to more than ``modulus / max_interval_s`` bytes/s
(17 GB/s at 0.25 s) is under-counted by whole wraps during that first interval only (rarely two).
Lower `max_interval_s` to shrink it, at the cost of more reads while idle.

The poll rate follows the traffic: while a counter moves, the next read comes before it can wrap
(`next_interval`, four-fold headroom: every ~19 ms at 55 GB/s, whose 32-bit wire counter wraps every
~75 ms); a link that moves slower than `quiet_bps` is read every `max_interval_s`; and once every counter
has stayed quiet for `settle_s` (an idle box: pure watching) the reads stretch to `idle_interval_s`, which
halves the driver calls of an idle box at the default 1 s against 0.5 s. The blind spot above then holds
with `idle_interval_s` for the first burst after a long quiet spell (more than 4.3 GB/s at 1 s); bursts
that follow within `settle_s` of traffic keep the shorter interval's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

COUNTER_MODULUS = 2**32
# Wire bytes per payload byte assumed until a calibration has measured it: a 256-byte max payload
# TLP carries ~20-26 bytes of header, sequence number, LCRC and framing, plus DLLP traffic (~8-9%).
DEFAULT_WIRE_OVERHEAD = 1.09


class CounterUnwrapper:
    """Turns successive reads of a wrapping counter into a monotonically growing total.

    Correct as long as the counter advanced by less than `modulus` between two reads. A raw value at
    or above the modulus proves the counter is wider than assumed, so the modulus widens to 2**64.
    """

    def __init__(self, modulus: int = COUNTER_MODULUS) -> None:
        self.modulus = modulus
        self.total = 0
        self._last: int | None = None

    def update(self, raw: int) -> int:
        """Feed one raw read; returns the total counted since the first read."""
        if raw >= self.modulus:
            self.modulus = 2**64
        if self._last is not None:
            self.total += (raw - self._last) % self.modulus
        self._last = raw
        return self.total


def next_interval(rate_bps: float, modulus: int, min_s: float, max_s: float, headroom: float = 0.25) -> float:
    """Seconds until the next read so that the rate may grow 1/headroom-fold before a wrap is missed."""
    if rate_bps <= 0:
        return max_s
    return min(max_s, max(min_s, headroom * modulus / rate_bps))


@dataclass(frozen=True, slots=True)
class CounterTotals:
    """Unwrapped totals of one GPU's counters at the monotonic time `t` of the read."""

    t: float
    tx: int
    rx: int


def rates(prev: CounterTotals, now: CounterTotals, scale: float) -> tuple[float, float] | None:
    """(TX, RX) bytes/s between two totals times `scale` (payload per counted unit); None if no time passed."""
    dt = now.t - prev.t
    if dt <= 0:
        return None
    return (now.tx - prev.tx) / dt * scale, (now.rx - prev.rx) / dt * scale


class TickRates:
    """Per-tick payload rates from a poller's totals, one slot per GPU: the rate since the totals the
    previous tick used, times that GPU's `scale` (payload per counted unit). When the poller has not
    read since the previous tick, that tick's rate is repeated rather than reported as NA."""

    def __init__(self, scales: Sequence[float]) -> None:
        self._scales = list(scales)
        self._prev: list[CounterTotals | None] = [None] * len(self._scales)
        self._last: list[tuple[float, float] | None] = [None] * len(self._scales)

    def update(self, totals: Sequence[CounterTotals | None]) -> list[tuple[float, float] | None]:
        """(TX, RX) per slot, None until two distinct reads exist."""
        for i, now in enumerate(totals):
            prev = self._prev[i]
            if now is None:
                continue
            r = rates(prev, now, self._scales[i]) if prev is not None else None
            if prev is None or r is not None:
                self._prev[i] = now
            if r is not None:
                self._last[i] = r
        return list(self._last)


Reader = Callable[[], tuple[int, int] | None]


class CounterPoller:
    """Background thread reading every GPU's raw (TX, RX) counters and accumulating 64-bit totals.

    `readers[i]()` returns GPU i's raw counters, or None when a read failed (the totals keep their
    last value).
    """

    def __init__(self, readers: Sequence[Reader], min_interval_s: float = 0.005, max_interval_s: float = 0.25,
                 quiet_bps: float = 256e6, clock: Callable[[], float] = time.monotonic,
                 idle_interval_s: float = 1.0, settle_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._readers = list(readers)
        self._min, self._max, self._quiet_bps = min_interval_s, max_interval_s, quiet_bps
        self._idle, self._settle_s = max(idle_interval_s, max_interval_s), settle_s
        self._clock, self._sleep = clock, sleep
        self._moved_at: float | None = None  # clock time of the last read that saw a counter move
        self._lock = threading.Lock()
        self._tx = [CounterUnwrapper() for _ in self._readers]
        self._rx = [CounterUnwrapper() for _ in self._readers]
        self._totals: list[CounterTotals | None] = [None] * len(self._readers)
        self._stop = threading.Event()
        self.reads = 0
        self.interval_s = max_interval_s
        self._thread = threading.Thread(target=self._run, name="gpudash-pcie-counters", daemon=True)

    def start(self) -> None:
        self.read_all()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def totals(self) -> list[CounterTotals | None]:
        """The latest totals per GPU (None until a first successful read)."""
        with self._lock:
            return list(self._totals)

    def read_all(self) -> float:
        """Read every GPU once; returns the fastest counter rate seen since the previous read (bytes/s)."""
        raws = [(read(), self._clock()) for read in self._readers]  # driver calls outside the lock
        fastest = 0.0
        with self._lock:
            for i, (raw, t) in enumerate(raws):
                if raw is None:
                    continue
                tx, rx = self._tx[i].update(raw[0]), self._rx[i].update(raw[1])
                prev = self._totals[i]
                if prev is not None and t > prev.t:
                    fastest = max(fastest, (tx - prev.tx) / (t - prev.t), (rx - prev.rx) / (t - prev.t))
                self._totals[i] = CounterTotals(t, tx, rx)
            self.reads += 1
        return fastest

    def step(self) -> float:
        """One round of the thread: read every GPU (twice after a long gap that looked busy) and return
        the seconds until the next round, which follow the fastest counter (see the module's doc)."""
        fastest = self.read_all()
        if self.interval_s > 4 * self._min and fastest >= self._quiet_bps and not self._stop.is_set():
            # After a long gap a busy-looking delta may have aliased; a second read one short gap
            # later measures a rate that cannot have, so a burst is noticed after one interval.
            self._sleep(self._min)
            fastest = self.read_all()
        now = self._clock()
        if self._moved_at is None or fastest >= self._quiet_bps:
            self._moved_at = now
        longest = self._idle if now - self._moved_at >= self._settle_s else self._max
        modulus = min((u.modulus for u in self._tx + self._rx), default=COUNTER_MODULUS)
        self.interval_s = next_interval(fastest, modulus, self._min, longest)
        return self.interval_s

    def _run(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(self.step())

