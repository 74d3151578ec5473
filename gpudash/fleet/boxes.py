"""One look at a fleet through Prometheus: a row per box (scrape target), with its GPUs, servers and
firing alerts, as frozen records the CLI prints and the Fleet tab shows.

Every target Prometheus scrapes is a row: one that exports no gpudash metrics is "no gpudash", one
that stopped answering (or left the scrape config within the last hour) is "down" with the time it was
last seen, one whose sampler stopped moving is "stale"; none is dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpudash.fleet import queries
from gpudash.fleet.client import PrometheusClient, PrometheusError

STALE_S = 60.0  # a box whose newest sample is older than this (while its target answers) is stale
UP, DOWN, STALE, NO_GPUDASH = "up", "down", "stale", "no gpudash"


@dataclass(frozen=True, slots=True)
class FleetServer:
    """One inference server on a box, as its gpudash exports it."""

    server: str
    kind: str
    state: str
    ttft_p90_s: float | None = None  # from the probe requests gpudash measured (histogram)
    ttft_mean_s: float | None = None  # the server's own mean over its last scrape interval
    hit_rate: float | None = None
    kv_usage: float | None = None
    tokens_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class FleetBox:
    """One scrape target."""

    instance: str
    job: str
    status: str  # up | down | stale | no gpudash
    last_seen: float | None = None  # the box's newest sample time (its clock), within the last hour
    hostname: str | None = None
    rig: str | None = None
    driver: str | None = None
    cuda: str | None = None
    version: str | None = None
    gpus: int | None = None
    util: float | None = None  # mean over the box's GPUs, 0..1
    mem_used: float | None = None
    mem_total: float | None = None
    tx_bps: float | None = None
    rx_bps: float | None = None
    link_bps: float | None = None  # what the GPUs' current links carry one way, summed
    servers: tuple[FleetServer, ...] = ()
    alerts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Fleet:
    """Every box Prometheus knows, at one time."""

    url: str
    ts: float
    boxes: tuple[FleetBox, ...] = field(default=())


def _value(row: dict[str, Any]) -> float | None:
    try:
        v = float(row["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _by(rows: Iterable[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float | None]:
    return {tuple(r["metric"].get(k, "") for k in labels): _value(r) for r in rows}


def read_fleet(client: PrometheusClient, job: str | None = None, now: float | None = None, *, detail: bool = True,
               instance: str | None = None) -> Fleet:
    """Every box (or the one `instance`), asked in one instant query (queries.combined); PrometheusError if
    it fails. Without `detail` the servers carry their state only (what a list of boxes shows)."""
    matchers = ",".join(m for m in (queries.job_matcher(job) if job else "",
                                    queries.instance_matcher(instance) if instance else "") if m)
    servers = queries.SERVER if detail else {"state": queries.SERVER["state"]}
    exprs = {**{f"box.{k}": v for k, v in queries.BOX.items()}, **{f"server.{k}": v for k, v in servers.items()}}
    exprs = {k: queries.fill(v, matchers) for k, v in exprs.items()}
    # Alerts by instance only: a rule that aggregates (by instance, server) drops the job label.
    exprs["alerts"] = queries.fill(queries.ALERTS, queries.instance_matcher(instance) if instance else "")
    at = time.time() if now is None else now
    answers: dict[str, list[dict[str, Any]]] = {f"server.{k}": [] for k in queries.SERVER}
    answers.update({k: [] for k in exprs})
    for row in client.query(queries.combined(exprs), at):
        part = answers.get(row["metric"].pop(queries.TAG, ""))
        if part is not None:
            part.append(row)
    return Fleet(client.url, at, _boxes(answers, at))


def _boxes(a: dict[str, list[dict[str, Any]]], now: float) -> tuple[FleetBox, ...]:
    up = {r["metric"].get("instance", ""): r for r in a["box.up"]}
    info = {r["metric"].get("instance", ""): r["metric"] for r in a["box.info"]}
    seen = _by(a["box.last_seen"], "instance")
    per = {k: _by(a[f"box.{k}"], "instance") for k in ("gpus", "util", "mem_used", "mem_total", "tx", "rx", "link")}
    servers = _servers(a)
    alerts: dict[str, list[str]] = {}
    for r in a["alerts"]:
        m = r["metric"]
        alerts.setdefault(m.get("instance", ""), []).append(m.get("alertname", "?"))
    boxes = []
    for inst in sorted(set(up) | set(info) | {k[0] for k in seen}):
        i = info.get(inst, {})
        last = seen.get((inst,))
        target = up.get(inst)
        if target is None or _value(target) != 1:
            status = DOWN
        elif not i and last is None:
            status = NO_GPUDASH
        elif last is None or now - last > STALE_S:
            status = STALE
        else:
            status = UP
        job = (target or {}).get("metric", {}).get("job") or i.get("job", "")
        gpus = per["gpus"].get((inst,))
        boxes.append(FleetBox(
            instance=inst, job=job, status=status, last_seen=last, hostname=i.get("hostname"), rig=i.get("rig"),
            driver=i.get("driver"), cuda=i.get("cuda"), version=i.get("version"),
            gpus=int(gpus) if gpus is not None else None, util=per["util"].get((inst,)),
            mem_used=per["mem_used"].get((inst,)), mem_total=per["mem_total"].get((inst,)),
            tx_bps=per["tx"].get((inst,)), rx_bps=per["rx"].get((inst,)), link_bps=per["link"].get((inst,)),
            servers=tuple(servers.get(inst, ())), alerts=tuple(sorted(alerts.get(inst, ())))))
    return tuple(boxes)


def _servers(a: dict[str, list[dict[str, Any]]]) -> dict[str, list[FleetServer]]:
    vals = {k: _by(a[f"server.{k}"], "instance", "server") for k in ("ttft_p90", "ttft_mean", "hit_rate", "kv",
                                                                       "tokens_per_s")}
    out: dict[str, list[FleetServer]] = {}
    for r in sorted(a["server.state"], key=lambda r: (r["metric"].get("instance", ""), r["metric"].get("server", ""))):
        m = r["metric"]
        key = (m.get("instance", ""), m.get("server", ""))
        out.setdefault(key[0], []).append(FleetServer(
            server=key[1], kind=m.get("kind", ""), state=m.get("state", ""), ttft_p90_s=vals["ttft_p90"].get(key),
            ttft_mean_s=vals["ttft_mean"].get(key), hit_rate=vals["hit_rate"].get(key), kv_usage=vals["kv"].get(key),
            tokens_per_s=vals["tokens_per_s"].get(key)))
    return out


def read_box_history(client: PrometheusClient, instance: str, seconds: float = 3600.0,
                     points: int = 120) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """The last `seconds` of one box's per-GPU series, for the drill-down's plots:
    {"util": {"0": [(ts, v), ...], ...}, "memory": ..., "pcie tx": ..., "pcie rx": ...}."""
    end = time.time()
    step = max(1.0, seconds / points)
    sel = queries.instance_matcher(instance)
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for name, expr in queries.GPU_SERIES.items():
        series = {}
        for r in client.query_range(queries.fill(expr, sel), end - seconds, end, step):
            pts = []
            for p in r.get("values", ()):
                try:
                    pts.append((float(p[0]), float(p[1])))
                except (TypeError, ValueError, IndexError):
                    continue
            series[r["metric"].get("gpu", "?")] = pts
        out[name] = series
    return out


__all__ = ["DOWN", "NO_GPUDASH", "STALE", "UP", "Fleet", "FleetBox", "FleetServer", "PrometheusError", "read_fleet",
           "read_box_history"]
