"""J/token before and after a change (a split, a share, an engine knob), as pure functions over a server's
counted energy and tokens (records.ServerEnergySample's cumulative figures).

Each side is a window of the same length, the one before the change ending at it and the one after
beginning once the change has taken effect; a side with fewer than `min_tokens` generated tokens says too
little, and the comparison is then "not enough traffic to compare", never a figure from a handful of tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MIN_TOKENS = 100.0  # generated tokens each side needs before its J/token is compared


@dataclass(frozen=True, slots=True)
class Side:
    """One window's energy and tokens."""

    joules: float
    tokens: float
    seconds: float

    @property
    def per_token(self) -> float | None:
        return self.joules / self.tokens if self.tokens > 0 else None


def side(samples: Sequence[tuple[float, float, float]], start: float, end: float) -> Side | None:
    """The change of cumulative (ts, joules, tokens) samples, in time order, between the first and the last
    inside [start, end]; None with fewer than two there."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    return Side(b[1] - a[1], b[2] - a[2], b[0] - a[0])


def combined(sides: Iterable[Side | None]) -> Side | None:
    """Several servers' sides of one window as one (an engine knob concerns every server); None if any is."""
    got = list(sides)
    if not got or any(s is None for s in got):
        return None
    return Side(sum(s.joules for s in got if s), sum(s.tokens for s in got if s), max(s.seconds for s in got if s))


def verdict(before: Side | None, after: Side | None, window_s: float,
            min_tokens: float = MIN_TOKENS) -> tuple[float | None, float | None, str]:
    """(J/token before, after, the sentence the Events entry carries)."""
    short = [name for name, s in (("before", before), ("after", after)) if s is None or s.tokens < min_tokens]
    if short or before is None or after is None:
        counts = ", ".join(f"{name} {0 if s is None else s.tokens:.0f}" for name, s in (("before", before),
                                                                                     ("after", after)))
        return None, None, (f"not enough traffic to compare (generated tokens in {window_s:.0f} s: {counts}; "
                            f"{min_tokens:.0f} needed each side)")
    b, a = before.per_token, after.per_token
    assert b is not None and a is not None
    return b, a, (f"J/token {b:.3g} -> {a:.3g} ({(a - b) / b:+.0%}), {window_s:.0f} s each side, "
                  f"{before.tokens:.0f} and {after.tokens:.0f} tokens")
