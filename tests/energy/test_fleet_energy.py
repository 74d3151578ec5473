"""J/token per box through a real Prometheus (Debian's), read by `gpudash fleet`'s own code:

  127.0.0.2  gpudash record --sim h200: energy from gpudash's counter, no tokens (no J/token, not 0)
  127.0.0.3  the dcgm-exporter stand-in (two H100s, its exposition from dcgm-exporter's own default counters
             file, tests/fleet/samples/PROVENANCE-dcgm-exporter.txt) whose energy counter, in mJ as
             dcgm-exporter's, grows at WATTS per GPU, beside a real llama-server scraped itself under load

and the box_energy rules on their own: each figure from its first source, named under `sources`."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from gpudash.fleet.boxes import read_fleet
from gpudash.fleet.client import PrometheusClient
from gpudash.fleet.energy import box_energy
from energy_helpers import keep_generating

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fleet"))
import dcgm_standin  # noqa: E402
from fleet_helpers import H100S, gpudash, serving, start_prometheus, stop, wait_for  # noqa: E402
from cli_helpers import free_ports  # noqa: E402

WATTS = 250.0
_ENERGY = re.compile(r"^(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{[^}]*\}) (\S+)$", re.M)


def test_box_energy_takes_each_figure_from_its_first_source() -> None:
    parts = {"energy.gpudash_gpu_energy_joules_total": {"a:9401": 300.0},
             "energy.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": {"a:9400": 200.0, "b:9400": 7.0},
             "tokens.llamacpp:tokens_predicted_total": {"a:8080": 40.0},
             "tokens.gpudash_server_generation_tokens_total": {"a:9401": 39.0}}
    watts, tokens, per_token, sources = box_energy(parts, ["a:8080", "a:9400", "a:9401"])
    assert (watts, tokens, per_token) == (500.0, 40.0, 12.5)  # the server's own count, not gpudash's as well
    assert sources == {"energy": "gpudash_gpu_energy_joules_total+DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                       "tokens": "llamacpp:tokens_predicted_total"}
    del parts["tokens.llamacpp:tokens_predicted_total"]
    assert box_energy(parts, ["a:9401"]) == (300.0, 39.0, 300.0 / 39.0,
                                             {"energy": "gpudash_gpu_energy_joules_total",
                                              "tokens": "gpudash_server_generation_tokens_total"})
    parts["tokens.gpudash_server_generation_tokens_total"] = {"a:9401": 0.0}
    assert box_energy(parts, ["a:9401"])[2] is None  # no token in the window: unknown, never infinite
    assert box_energy(parts, ["c:9400"]) == (None, None, None, {})


def _growing_standin(host: str, gpus: list[dict]) -> ThreadingHTTPServer:
    """dcgm_standin's exposition with each GPU's energy counter (mJ) growing at WATTS since it started."""
    t0 = time.time()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            grown = WATTS * 1000.0 * (time.time() - t0)
            text = _ENERGY.sub(lambda m: f"{m.group(1)} {float(m.group(2)) + grown:.0f}",
                               dcgm_standin.exposition(gpus, "box-03"))
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return ThreadingHTTPServer((host, 0), Handler)


@pytest.mark.llama
def test_fleet_joules_per_token_per_box_through_prometheus(tmp_path: Path, llama_server: str,
                                                           tiny_model: Path) -> None:
    gp, lp = free_ports(2)
    procs: list[subprocess.Popen] = []
    load_stop = threading.Event()
    with serving(_growing_standin("127.0.0.3", H100S)) as dp:
        try:
            procs.append(gpudash(tmp_path, "record", "--sim", "h200", "--interval", "0.5", "--db",
                                 str(tmp_path / "g.db"), "--prometheus", f"127.0.0.2:{gp}", "--quiet"))
            procs.append(subprocess.Popen([llama_server, "-m", str(tiny_model), "--host", "127.0.0.3", "--port",
                                           str(lp), "--metrics", "-c", "512", "-np", "1"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            prom = start_prometheus(tmp_path / "prom", {"gpudash": [f"127.0.0.2:{gp}"],
                                                        "dcgm-exporter": [f"127.0.0.3:{dp}"],
                                                        "llama-server": [f"127.0.0.3:{lp}"]})
            procs.append(prom.proc)
            url = f"http://127.0.0.3:{lp}"

            def healthy() -> bool:
                try:
                    return httpx.get(f"{url}/health", timeout=1, trust_env=False).status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(healthy, 60, "the llama-server")

            keep_generating(url, load_stop, n_predict=32)
            wait_for(lambda: prom.query("rate(llamacpp:tokens_predicted_total[5m]) > 0")
                     and prom.query("rate(gpudash_gpu_energy_joules_total[5m]) > 0")
                     and prom.query("rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]) > 0"), 60, "rates in Prometheus")
            at = time.time()
            client = PrometheusClient(prom.url)
            try:
                fleet = read_fleet(client, detail=False, now=at)
                raw = {name: client.query(f"sum by (instance) (rate({name}[5m]))", at) for name in
                       ("gpudash_gpu_energy_joules_total", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                        "llamacpp:tokens_predicted_total")}
            finally:
                client.close()
        finally:
            load_stop.set()
            for p in reversed(procs):
                stop(p)
    boxes = {b.box: b for b in fleet.boxes}
    sim, dcgm = boxes["127.0.0.2"], boxes["127.0.0.3"]
    # Prometheus' own rates at the same instant (over 5m: on a rig minutes old, below the power itself)
    rate = {name: float(rows[0]["value"][1]) for name, rows in raw.items()}
    assert sim.sources == {"energy": "gpudash_gpu_energy_joules_total"}
    assert sim.power_w == pytest.approx(rate["gpudash_gpu_energy_joules_total"])
    assert sim.tokens_per_s is None and sim.joules_per_token is None  # no tokens: unknown, not 0
    assert dcgm.sources == {"energy": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "tokens": "llamacpp:tokens_predicted_total"}
    assert dcgm.power_w == pytest.approx(rate["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] / 1000)  # mJ/s to W
    assert dcgm.tokens_per_s == pytest.approx(rate["llamacpp:tokens_predicted_total"]) and dcgm.tokens_per_s > 0
    assert dcgm.joules_per_token == pytest.approx(dcgm.power_w / dcgm.tokens_per_s)
