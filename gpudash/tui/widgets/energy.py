"""What a server's tokens cost in energy, as the views say it (records.ServerEnergySample): the Servers
view's J/token column and detail line, and the Overview's line of every server's J/token.

Unknown stays unknown: no token in the window is "—", never 0 or infinite; the split that gave the energy
is said (whole_gpu, or sm_share of a shared GPU), and energy no split could attribute is counted apart."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from gpudash import fmt
from gpudash.outside import printable
from gpudash.records import ServerEnergySample


def joules(j: float | None) -> str:
    """1234.5 -> "1.23 kJ"; 0.35 -> "0.35 J"; None -> "—"."""
    if j is None:
        return fmt.NA
    for scale, unit in ((1e6, "MJ"), (1e3, "kJ")):
        if abs(j) >= scale:
            return f"{j / scale:.3g} {unit}"
    return f"{j:.3g} J"


def count(n: float | None) -> str:
    """12_000_000 -> "12M"; None -> "—"."""
    if n is None:
        return fmt.NA
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def per_token_cell(e: ServerEnergySample | None) -> str:
    """The Servers view's "J/token 1m" cell."""
    return fmt.NA if e is None else joules(e.j_per_token_1m)


def detail(e: ServerEnergySample) -> str:
    """The selected server's energy on one line: J per generated token and per 1,000 prompt tokens over the
    last minute and since counting began, tokens per kWh, busy and idle energy, on which GPUs by which split."""
    line = (f"energy: {joules(e.j_per_token_1m)}/token, {joules(e.j_per_kprompt_1m)}/1k prompt tokens (last "
            f"minute); session {joules(e.j_per_token)}/token, {joules(e.j_per_kprompt)}/1k prompt, "
            f"{count(e.tokens_per_kwh)} tokens/kWh; busy {joules(e.busy_j)}, "
            f"idle {joules(e.idle_j)} on GPU {e.gpus} ({e.split})")
    if e.unattributed_j:
        line += f"; {joules(e.unattributed_j)} of shared GPUs unattributed (SM use unknown)"
    return line


def overview_line(energy: Sequence[ServerEnergySample], width: int) -> Text:
    """Every counted server's J/token over the last minute (session's after "/"), cut to `width`."""
    parts = [f"{printable(e.server)} {joules(e.j_per_token_1m)} / {joules(e.j_per_token)}" for e in energy]
    return Text(("J/token 1m / session: " + "  ".join(parts))[:width] if parts else "")
