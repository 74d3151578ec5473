"""One look at a fleet through Prometheus: a row per box, with its GPUs, servers and firing alerts, as frozen
records the CLI prints and the Fleet tab shows.

A box is a host: the scrape targets whose `instance` names the same host (dcgm-exporter on :9400, vLLM on
:8000, gpudash on :9401) are one box, so a box that runs no gpudash still shows its GPUs and servers, and
one that runs gpudash beside dcgm-exporter shows each figure once, with the series it came from
(queries.GPU_FIGURES, SERVER_FIGURES). The fleet is every target of the jobs that export gpudash,
dcgm-exporter, vLLM or llama-server series (or of the jobs asked for). A box none of whose targets answers
(or that left the scrape config within the last hour) is "down" with the time it was last seen, one with
some targets down "partly down", one whose gpudash sampler stopped moving "stale"; none is dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gpudash.fleet import queries
from gpudash.fleet.client import PrometheusClient, PrometheusError
from gpudash.fleet.energy import box_energy

STALE_S = 60.0  # a box whose gpudash's newest sample is older than this (while its target answers) is stale
UP, DOWN, PARTLY, STALE, NO_METRICS = "up", "down", "partly down", "stale", "no GPU metrics"


@dataclass(frozen=True, slots=True)
class FleetTarget:
    """One scrape target of a box and what it exports ("gpudash", "dcgm-exporter", "vllm", "llama.cpp")."""

    instance: str
    job: str
    up: bool
    exports: tuple[str, ...] = ()
    last_seen: float | None = None  # its last answered scrape within the last hour


@dataclass(frozen=True, slots=True)
class FleetGpu:
    """One GPU of a box; `sources` names the series each figure came from (figure -> family)."""

    uuid: str
    gpu: str  # its index on the box, as the series say it
    model: str | None = None
    util: float | None = None  # 0..1
    mem_used: float | None = None
    mem_total: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    xid: float | None = None  # the last Xid it reported
    tx_bps: float | None = None
    rx_bps: float | None = None
    link_bps: float | None = None  # what its current PCIe link carries one way
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetServer:
    """One inference server on a box: from gpudash's series (state, probe), from its own (when Prometheus
    scrapes it: `instance`), or both, matched by the port it listens on."""

    server: str
    kind: str
    state: str
    instance: str | None = None  # the target of its own /metrics, when Prometheus scrapes it
    origin: str | None = None  # how gpudash knows it (managed, attached, found); None: no gpudash reads it
    ttft_p90_s: float | None = None  # of every request it served (its own histogram)
    probe_ttft_p90_s: float | None = None  # of gpudash's probe requests
    hit_rate: float | None = None  # prefix-cache hits of every request (its own counters)
    probe_hit_rate: float | None = None  # of the probe's requests
    kv_usage: float | None = None
    tokens_per_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetBox:
    """One host and its targets. The totals count each GPU once, each figure from its first source."""

    box: str  # the host its targets' instances name
    status: str  # up | down | partly down | stale | no GPU metrics
    targets: tuple[FleetTarget, ...] = ()
    last_seen: float | None = None  # when it last answered (or its gpudash last sampled), within the last hour
    hostname: str | None = None  # what gpudash or dcgm-exporter calls the host
    rig: str | None = None
    driver: str | None = None
    cuda: str | None = None
    version: str | None = None
    gpu_count: int | None = None
    util: float | None = None  # mean over the GPUs that report one, 0..1
    mem_used: float | None = None
    mem_total: float | None = None
    tx_bps: float | None = None
    rx_bps: float | None = None
    link_bps: float | None = None  # what the GPUs' current links carry one way, summed
    gpus: tuple[FleetGpu, ...] = ()  # read with detail only (a list of boxes has the totals)
    servers: tuple[FleetServer, ...] = ()
    alerts: tuple[str, ...] = ()
    power_w: float | None = None  # its GPUs' energy counters' rate over the window (fleet/energy.py)
    tokens_per_s: float | None = None  # its servers' generated tokens per second, from their first source
    joules_per_token: float | None = None
    sources: dict[str, str] = field(default_factory=dict)  # "energy", "tokens" -> the series they came from

    @property
    def exports(self) -> tuple[str, ...]:
        return tuple(sorted({e for t in self.targets for e in t.exports}))


@dataclass(frozen=True, slots=True)
class Fleet:
    """Every box Prometheus knows, at one time."""

    url: str
    ts: float
    boxes: tuple[FleetBox, ...] = field(default=())


def host_of(instance: str) -> str:
    """The host an instance names: "gpu-01:9400" -> "gpu-01", "[::1]:9400" -> "::1"; as is without a port."""
    host, sep, port = instance.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or (host.count(":") and not host.endswith("]")):
        return instance
    return host.strip("[]")


def _value(row: dict[str, Any]) -> float | None:
    try:
        v = float(row["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def read_fleet(client: PrometheusClient, job: str | None = None, now: float | None = None, *, detail: bool = True,
               instances: list[str] | None = None) -> Fleet:
    """Every box of the fleet (or the one whose targets are `instances`), asked in few combined instant
    queries side by side (queries.combined), and one more for when the targets that do not answer last
    did; PrometheusError if any fails. With `detail` each box has its GPUs and its servers' figures;
    without (what a list of boxes shows: one query) its GPU totals and its servers' states."""
    sel = [queries.job_matcher(job)] if job else []
    if instances:
        sel.append(queries.instances_matcher(instances))
    matchers = ",".join(sel)
    base = {k: queries.fill(v, matchers) for k, v in queries.PARTS.items()}
    # Alerts by instance only: a rule that aggregates (by instance, server) drops the job label.
    base["alerts"] = queries.fill(queries.ALERTS, queries.instances_matcher(instances) if instances else "")
    if detail:  # each group one query, the groups evaluated at once: `or` over every part costs Prometheus more
        groups = [base, {k: queries.fill(v, matchers) for k, v in queries.GPU_PARTS.items()},
                  {f"server.{k}": queries.fill(v, matchers) for k, v in queries.SERVER_PARTS.items()}]
    else:
        groups = [{**base, **{k: queries.fill(v, matchers) for k, v in queries.TOTAL_PARTS.items()}}]
    at = time.time() if now is None else now
    answers: dict[str, list[dict[str, Any]]] = {k: [] for g in groups for k in g}
    for rows in client.query_all([queries.combined(g) for g in groups], at):
        for row in rows:
            part = answers.get(row["metric"].pop(queries.TAG, ""))
            if part is not None:
                part.append(row)
    fleet = _Assembly(answers, at, every_job=job is not None or bool(instances))
    down = [t.instance for t in fleet.targets.values() if not t.up]
    if down:
        fleet.seen(client.query(queries.fill(queries.SEEN, queries.instances_matcher(down)), at))
    return Fleet(client.url, at, fleet.boxes())


class _Assembly:
    """The parts of one answer put together into boxes."""

    def __init__(self, a: dict[str, list[dict[str, Any]]], now: float, every_job: bool) -> None:
        self.a, self.now = a, now
        self.members: dict[tuple[str, str], set[str]] = {}  # (instance, job) -> what it exports
        self.model: dict[str, str] = {}  # a vLLM target's model name
        for part, rows in a.items():
            if part.startswith("member."):
                for r in rows:
                    m = r["metric"]
                    self.members.setdefault((m.get("instance", ""), m.get("job", "")), set()).add(part[7:])
                    if m.get("model_name"):
                        self.model.setdefault(m.get("instance", ""), m["model_name"])
        jobs = {job for _, job in self.members}
        self.targets: dict[str, FleetTarget] = {}
        for r in a.get("up", ()):
            key = (r["metric"].get("instance", ""), r["metric"].get("job", ""))
            if every_job or key[1] in jobs:
                self.targets[key[0]] = FleetTarget(key[0], key[1], _value(r) == 1,
                                                   tuple(sorted(self.members.get(key, ()))))
        for (inst, job), what in self.members.items():  # gone from the scrape config within the hour: down
            if inst not in self.targets:
                self.targets[inst] = FleetTarget(inst, job, False, tuple(sorted(what)))

    def seen(self, rows: list[dict[str, Any]]) -> None:
        """When each target that does not answer now last did (SEEN's answer)."""
        for r in rows:
            t = self.targets.get(r["metric"].get("instance", ""))
            if t is not None and t.job == r["metric"].get("job", t.job):
                self.targets[t.instance] = replace(t, last_seen=_value(r))

    def boxes(self) -> tuple[FleetBox, ...]:
        hosts: dict[str, list[FleetTarget]] = {}
        for t in self.targets.values():
            hosts.setdefault(host_of(t.instance), []).append(t)
        info = {r["metric"].get("instance", ""): r["metric"] for r in self.a.get("info", ())}
        dcgm = {r["metric"].get("instance", ""): r["metric"] for r in self.a.get("dcgm.host", ())}
        sampled = {r["metric"].get("instance", ""): _value(r) for r in self.a.get("sampled", ())}
        gpus, servers, alerts = self._gpus(), self._servers(), self._alerts()
        totals = {k.removeprefix("total."): _by_instance(rows) for k, rows in self.a.items() if k.startswith("total.")}
        energy = {k: _by_instance(rows) for k, rows in self.a.items() if k in queries.ENERGY_PARTS}
        out = []
        for host, targets in sorted(hosts.items()):
            targets.sort(key=lambda t: t.instance)
            insts = [t.instance for t in targets]
            gd = next((info[i] for i in insts if i in info), {})
            dc = next((dcgm[i] for i in insts if i in dcgm), {})
            times = [v for v in [*(sampled.get(i) for i in insts), *(t.last_seen for t in targets)] if v is not None]
            newest_sample = max((v for i in insts if (v := sampled.get(i)) is not None), default=None)
            box_gpus = _merge_gpus(g for i in insts for g in gpus.get(i, ()))
            watts, tokens, per_token, energy_from = box_energy(energy, insts)
            out.append(FleetBox(
                box=host, status=_status(targets, gd, newest_sample, self.now), targets=tuple(targets),
                last_seen=max(times) if times else None,
                # gpudash's box_info says Hostname as dcgm-exporter does (its older releases: hostname)
                hostname=gd.get("Hostname") or gd.get("hostname") or dc.get("Hostname") or dc.get("hostname"),
                rig=gd.get("rig"),
                driver=gd.get("driver") or dc.get("DCGM_FI_DRIVER_VERSION"), cuda=gd.get("cuda"),
                version=gd.get("version"), **(_summed(totals, insts) if totals else _totals(box_gpus)), gpus=box_gpus,
                servers=self._box_servers(targets, servers),
                alerts=tuple(sorted(a for i in insts for a in alerts.get(i, ()))),
                power_w=watts, tokens_per_s=tokens, joules_per_token=per_token, sources=energy_from))
        return tuple(out)

    def _alerts(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for r in self.a.get("alerts", ()):
            m = r["metric"]
            out.setdefault(m.get("instance", ""), []).append(m.get("alertname") or "?")
        return out

    def _gpus(self) -> dict[str, list[tuple[str, str, str, dict[str, float]]]]:
        """instance -> its GPUs as (uuid, index, model, {family: value})."""
        per: dict[tuple[str, str], tuple[str, str, dict[str, float]]] = {}
        for name in queries.GPU_FAMILIES:
            for r in self.a.get(f"gpu.{name}", ()):
                m = r["metric"]
                uuid = m.get("UUID") or m.get("uuid") or f"GPU{m.get('gpu', '?')}"
                v = _value(r)
                entry = per.setdefault((m.get("instance", ""), uuid), (m.get("gpu", "?"), m.get("modelName", ""), {}))
                if v is not None:
                    entry[2][name] = v
        out: dict[str, list[tuple[str, str, str, dict[str, float]]]] = {}
        for (inst, uuid), (index, model, values) in per.items():
            out.setdefault(inst, []).append((uuid, index, model, values))
        return out

    def _servers(self) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, dict[str, Any]]]:
        """The rows that say something of a server, by part: of each gpudash server (instance -> server ->
        parts) and of each server target (instance -> parts)."""
        ours: dict[str, dict[str, dict[str, Any]]] = {}
        theirs: dict[str, dict[str, Any]] = {}
        for part in ("server.state", "server.info", *(f"server.{k}" for k in queries.SERVER_PARTS)):
            for r in self.a.get(part, ()):
                m = r["metric"]
                inst = m.get("instance", "")
                parts = ours.setdefault(inst, {}).setdefault(m["server"], {}) if "server" in m else \
                    theirs.setdefault(inst, {})
                parts[part.removeprefix("server.")] = r
        return ours, theirs

    def _box_servers(self, targets: list[FleetTarget], rows: tuple[dict[str, dict[str, dict[str, Any]]],
                                                                    dict[str, dict[str, Any]]]) -> tuple[FleetServer, ...]:
        ours, theirs = rows
        own = {t.instance: t for t in targets if {"vllm", "llama.cpp"} & set(t.exports)}
        by_port = {t.instance.rpartition(":")[2]: t for t in own.values()}
        out = []
        matched: set[str] = set()
        for t in targets:
            for name, parts in sorted(ours.get(t.instance, {}).items()):
                state, info = parts.get("state"), parts.get("info")
                m = (state or info or next(iter(parts.values())))["metric"]
                port = (info or {}).get("metric", {}).get("port", "")
                target = by_port.get(port) if port else None
                figures = dict(parts)
                if target is not None:
                    matched.add(target.instance)
                    figures.update({k: v for k, v in theirs.get(target.instance, {}).items() if k not in figures})
                out.append(_server(name, m.get("kind") or _kind(target), m.get("state") if state else
                                   _target_state(target, figures), target, (info or {}).get("metric", {}).get("origin"),
                                   figures))
        for inst, target in sorted(own.items()):
            if inst not in matched:
                figures = theirs.get(inst, {})
                out.append(_server(self.model.get(inst) or inst, _kind(target), _target_state(target, figures),
                                   target, None, figures))
        return tuple(out)


_SUMMED = ("mem_used", "mem_total", "tx_bps", "rx_bps", "link_bps")


def _by_instance(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {r["metric"].get("instance", ""): v for r in rows if (v := _value(r)) is not None}


def _totals(gpus: tuple[FleetGpu, ...]) -> dict[str, Any]:
    """A box's totals from its GPUs."""
    out: dict[str, Any] = {"gpu_count": len(gpus) or None}
    util = [g.util for g in gpus if g.util is not None]
    out["util"] = sum(util) / len(util) if util else None
    for figure in _SUMMED:
        values = [getattr(g, figure) for g in gpus if getattr(g, figure) is not None]
        out[figure] = sum(values) if values else None
    return out


def _summed(totals: dict[str, dict[str, float]], instances: list[str]) -> dict[str, Any]:
    """A box's totals from its targets' (queries.TOTAL_PARTS)."""
    def total(figure: str) -> float | None:
        values = [totals.get(figure, {}).get(i) for i in instances]
        present = [v for v in values if v is not None]
        return sum(present) if present else None

    gpus, util, util_n = total("gpus"), total("util"), total("util_n")
    return {"gpu_count": int(gpus) if gpus else None, "util": util / util_n if util is not None and util_n else None,
            **{figure: total(figure) for figure in _SUMMED}}


def _kind(target: FleetTarget | None) -> str:
    if target is None:
        return "unknown"
    return next((k for k in ("vllm", "llama.cpp") if k in target.exports), "unknown")


def _target_state(target: FleetTarget | None, figures: dict[str, Any]) -> str:
    """A server known only from its own series: ready while its target answers (sleeping when vLLM says it
    sleeps), unreachable when it does not."""
    if target is None:
        return "unknown"
    if not target.up:
        return "unreachable"
    awake = _value(figures["vllm:awake"]) if "vllm:awake" in figures else None
    return "sleeping" if awake == 0 else "ready"


def _server(name: str, kind: str, state: str, target: FleetTarget | None, origin: str | None,
            figures: dict[str, Any]) -> FleetServer:
    values: dict[str, float | None] = {}
    sources: dict[str, str] = {}
    for figure, parts in queries.SERVER_FIGURES.items():
        for part in parts:
            v = _value(figures[part]) if part in figures else None
            if v is not None:
                values[figure], sources[figure] = v, part
                break
    return FleetServer(server=name, kind=kind, state=state, instance=target.instance if target else None,
                       origin=origin, sources=sources, **values)


def _merge_gpus(found: Iterable[tuple[str, str, str, dict[str, float]]]) -> tuple[FleetGpu, ...]:
    """The box's GPUs by UUID, each figure from the first source that has it (queries.GPU_FIGURES)."""
    by_uuid: dict[str, tuple[str, str, dict[str, float]]] = {}
    for uuid, index, model, values in found:
        known = by_uuid.setdefault(uuid, (index, model, {}))
        known[2].update({k: v for k, v in values.items() if k not in known[2]})
        if not known[1] and model:
            by_uuid[uuid] = (known[0], model, known[2])
    gpus = []
    for uuid, (index, model, values) in by_uuid.items():
        figures: dict[str, float] = {}
        sources: dict[str, str] = {}
        for figure, options in queries.GPU_FIGURES.items():
            for src in options:
                if all(f in values for f in src.families):
                    used = [*src.families, *(f for f in src.extra if f in values)]
                    figures[figure] = sum(values[f] for f in used) * src.scale
                    sources[figure] = "+".join(used)
                    break
        gpus.append(FleetGpu(uuid=uuid, gpu=index, model=model or None, sources=sources, **figures))
    # ASCII digits only: "²".isdigit() is true and int("²") raises; int("١") is 1, but no exporter writes it
    return tuple(sorted(gpus, key=lambda g: (int(g.gpu) if g.gpu.isascii() and g.gpu.isdigit() else 1 << 30, g.gpu,
                                             g.uuid)))


def _status(targets: list[FleetTarget], gpudash_info: dict[str, str], newest_sample: float | None, now: float) -> str:
    answering = [t for t in targets if t.up]
    if not answering:
        return DOWN
    if any(t.up and "gpudash" in t.exports for t in targets) and (newest_sample is None
                                                                  or now - newest_sample > STALE_S):
        return STALE
    if len(answering) < len(targets):
        return PARTLY
    if not any(t.exports for t in targets) and not gpudash_info:
        return NO_METRICS
    return UP


def read_box_history(client: PrometheusClient, instances: list[str], seconds: float = 3600.0,
                     points: int = 120) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """The last `seconds` of one box's per-GPU series (its targets' `instances`), for the drill-down's plots:
    {"util": {"0": [(ts, v), ...], ...}, "memory": ..., "pcie tx": ..., "pcie rx": ...}."""
    end = time.time()
    step = max(1.0, seconds / points)
    sel = queries.instances_matcher(instances)
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for name, expr in queries.GPU_SERIES.items():
        series: dict[str, list[tuple[float, float]]] = {}
        for r in client.query_range(queries.fill(expr, sel), end - seconds, end, step):
            pts = []
            for p in r.get("values", ()):
                try:
                    pts.append((float(p[0]), float(p[1])))
                except (TypeError, ValueError, IndexError):
                    continue
            series.setdefault(r["metric"].get("gpu", "?"), pts)
        out[name] = series
    return out


__all__ = ["DOWN", "NO_METRICS", "PARTLY", "STALE", "UP", "Fleet", "FleetBox", "FleetGpu", "FleetServer",
           "FleetTarget", "PrometheusError", "host_of", "read_fleet", "read_box_history"]
