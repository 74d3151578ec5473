"""The fleet as the Fleet tab reads it: one Prometheus client, made on first use and kept, asked for the
list of boxes and for one box's detail. Every failure is a PrometheusError with one sentence."""

from __future__ import annotations

import threading

from gpudash.config import FleetConfig
from gpudash.fleet.boxes import Fleet, FleetBox, read_box_history, read_fleet
from gpudash.fleet.client import PrometheusClient, PrometheusError

__all__ = ["FleetReader", "PrometheusError"]


class FleetReader:
    """Reads the fleet of one [fleet] setting; safe to call from several worker threads."""

    def __init__(self, settings: FleetConfig) -> None:
        self.settings = settings
        self._client: PrometheusClient | None = None
        self._lock = threading.Lock()

    def _get(self) -> PrometheusClient:
        with self._lock:
            if self._client is None:
                if not self.settings.prometheus:
                    raise PrometheusError("no Prometheus is set: give [fleet] prometheus or --fleet URL")
                self._client = PrometheusClient(self.settings.prometheus, self.settings.timeout_s)
            return self._client

    def boxes(self) -> Fleet:
        """Every box of the configured job, each server with its state only (a list of boxes)."""
        return read_fleet(self._get(), self.settings.job, detail=False)

    def box(self, box: FleetBox) -> tuple[dict[str, dict[str, list[tuple[float, float]]]], FleetBox | None]:
        """One box's last hour of GPU series, and the box read again with its servers' TTFT, hit rate and KV."""
        client = self._get()
        instances = [t.instance for t in box.targets]
        boxes = [b for b in read_fleet(client, instances=instances).boxes if b.box == box.box]
        return read_box_history(client, instances), boxes[0] if boxes else None

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
