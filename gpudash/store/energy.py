"""Each recorded session's energy per token, read back from `server_energy_samples` (and its 1-minute tier,
where retention has folded older rows): a server's figures are cumulative counters, so their largest value
in a session is where counting ended."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import sqlite_utils

from gpudash.store.schema import rollup_table

_TABLE = "server_energy_samples"
_FIGURES = ("busy_j", "idle_j", "generation_tokens", "prompt_tokens")


@dataclass(frozen=True, slots=True)
class SessionEnergy:
    """One server's energy and tokens over a session."""

    server: str
    busy_j: float
    idle_j: float
    generation_tokens: float
    prompt_tokens: float

    @property
    def j_per_token(self) -> float | None:
        return (self.busy_j + self.idle_j) / self.generation_tokens if self.generation_tokens > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "j_per_token": self.j_per_token}


def session_energy(db: sqlite_utils.Database) -> dict[int, list[SessionEnergy]]:
    """{session id: its servers' energy, by name}, for the sessions that counted any (a file from before the
    table existed has none)."""
    tables = set(db.table_names())
    if _TABLE not in tables:
        return {}
    parts = [f"SELECT session_id, server, {', '.join(_FIGURES)} FROM [{_TABLE}]"]
    if rollup_table(_TABLE) in tables:
        parts.append(f"SELECT session_id, server, {', '.join(f + '_max' for f in _FIGURES)} "
                     f"FROM [{rollup_table(_TABLE)}]")
    sql = (f"SELECT session_id, server, {', '.join(f'max({f})' for f in _FIGURES)} FROM "
           f"({' UNION ALL '.join(parts)}) GROUP BY session_id, server ORDER BY session_id, server")
    out: dict[int, list[SessionEnergy]] = {}
    for sid, server, *values in db.execute(sql).fetchall():
        out.setdefault(sid, []).append(SessionEnergy(str(server), *(float(v or 0.0) for v in values)))
    return out
