"""The metric families of one scrape, filled series by series (gpudash/telemetry/prometheus.py and
prom_servers.py): a family is made on its first series, and a series about the box's GPUs, host, engine
or pools also carries the rig's `source` label (`nvml` or `sim:<profile>`), so a simulated value stays
labelled on a fleet dashboard."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import Metric


class Families:
    """Metric families being filled for one scrape."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.families: dict[str, Metric] = {}

    def family(self, kind: type, name: str, doc: str, labels: list[str], sourced: bool = True) -> Any:
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = kind(name, doc, labels=[*labels, "source"] if sourced else labels)
        return fam

    def value(self, kind: type, name: str, doc: str, labels: dict[str, str], value: float,
              sourced: bool = True) -> None:
        values = [*labels.values(), self.source] if sourced else list(labels.values())
        self.family(kind, name, doc, list(labels), sourced).add_metric(values, float(value))
