"""The mixed fleet every test in this folder may use: Debian's Prometheus scraping six hosts, each its own
loopback address (a box is a host: the targets on one address are one box), as operators run them:

  127.0.0.2  gpudash record --sim h200, alone
  127.0.0.3  gpudash record --sim 8xh20 beside a dcgm-exporter (the stand-in, for the same GPUs; gpu = "auto")
  127.0.0.4  a real llama-server (-np 2, --metrics) scraped itself, and gpudash serve --sim rtx5080+rtx3090
             attached to it with the probe on
  127.0.0.5  a dcgm-exporter (two H100s) and the vLLM double, scraped themselves: no gpudash
  127.0.0.6  the vLLM double scraped itself, and gpudash serve --sim h200 attached to it with the probe on,
             re-exporting the server's own figures too ([prometheus] servers = "all")
  127.0.0.7  a gpudash target where nothing listens
plus Prometheus scraping itself on 127.0.0.1 (a job that exports none of the fleet's series).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_helpers import (ALERTS_NOW, DOUBLE, H100S, RULES, FleetRig, binary, gpudash, sim_gpus, start_prometheus,
                           stop, wait_for)
from cli_helpers import free_ports  # noqa: E402 (fleet_helpers puts tests/cli on the path)

STANDIN = Path(__file__).resolve().parent / "dcgm_standin.py"
PROBE = "[probe]\ninterval_s = 0.5\nprompt_tokens = 64\nmax_tokens = 2\nshared_prefix = 0.8\n\n"


def _standin(host: str, port: int, gpus: list[dict]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(STANDIN), "--host", host, "--port", str(port), "--gpus",
                             json.dumps(gpus)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _double(host: str, port: int, model: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(DOUBLE), "serve", model, "--host", host, "--port", str(port),
                             "--enable-prompt-tokens-details"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=1, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def fleet_rig(tmp_path_factory: pytest.TempPathFactory, llama_server: str, tiny_model: Path) -> Iterator[FleetRig]:
    binary("prometheus")
    tmp = tmp_path_factory.mktemp("fleet")
    procs: list[subprocess.Popen] = []
    jobs: dict[str, list[str]] = {"gpudash": [], "dcgm-exporter": [], "vllm": [], "llama-server": []}
    targets: dict[str, str] = {}  # instance -> what answers there
    ports = iter(free_ports(12))

    def box_dir(name: str) -> Path:
        d = tmp / name
        d.mkdir()
        return d

    def add(job: str, instance: str, what: str) -> None:
        jobs[job].append(instance)
        targets[instance] = what

    try:
        # 127.0.0.2: gpudash alone
        p = next(ports)
        d = box_dir("h200")
        procs.append(gpudash(d, "record", "--sim", "h200", "--interval", "0.5", "--db", str(d / "g.db"),
                             "--prometheus", f"127.0.0.2:{p}", "--quiet"))
        add("gpudash", f"127.0.0.2:{p}", "gpudash sim:h200")
        # 127.0.0.3: gpudash beside dcgm-exporter, on the same GPUs; gpudash asks it (gpu = "auto")
        dp, gp = next(ports), next(ports)
        procs.append(_standin("127.0.0.3", dp, sim_gpus("8xh20")))
        wait_for(lambda: _answers(f"http://127.0.0.3:{dp}/metrics"), 30, "the dcgm-exporter stand-in")
        d = box_dir("8xh20")
        (d / "gpudash.toml").write_text(f'[prometheus]\ndcgm_exporter = "http://127.0.0.3:{dp}/metrics"\n')
        procs.append(gpudash(d, "--config", str(d / "gpudash.toml"), "record", "--sim", "8xh20", "--interval", "0.5",
                             "--db", str(d / "g.db"), "--prometheus", f"127.0.0.3:{gp}", "--quiet"))
        add("dcgm-exporter", f"127.0.0.3:{dp}", "dcgm-exporter")
        add("gpudash", f"127.0.0.3:{gp}", "gpudash sim:8xh20")
        # 127.0.0.4: a real llama-server scraped itself, and gpudash attached to it
        lp, gp = next(ports), next(ports)
        procs.append(subprocess.Popen([llama_server, "-m", str(tiny_model), "--host", "127.0.0.4", "--port", str(lp),
                                       "--metrics", "-c", "4096", "-np", "2"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(lambda: _answers(f"http://127.0.0.4:{lp}/health"), 60, "llama-server")
        d = box_dir("llama")
        (d / "gpudash.toml").write_text(PROBE.replace("= 64", "= 16") + '[[servers]]\nname = "code"\n'
                                        f'kind = "llama.cpp"\nurl = "http://127.0.0.4:{lp}"\nprobe = true\n')
        procs.append(gpudash(d, "serve", "--config", str(d / "gpudash.toml"), "--sim", "rtx5080+rtx3090",
                             "--db", str(d / "g.db"), "--prometheus", f"127.0.0.4:{gp}", "--quiet"))
        add("llama-server", f"127.0.0.4:{lp}", "llama-server")
        add("gpudash", f"127.0.0.4:{gp}", "gpudash sim:rtx5080+rtx3090")
        # 127.0.0.5: dcgm-exporter and vLLM, no gpudash
        dp, vp = next(ports), next(ports)
        procs.append(_standin("127.0.0.5", dp, H100S))
        procs.append(_double("127.0.0.5", vp, "meta-llama/Llama-3.1-8B-Instruct"))
        add("dcgm-exporter", f"127.0.0.5:{dp}", "dcgm-exporter")
        add("vllm", f"127.0.0.5:{vp}", "vllm")
        # 127.0.0.6: vLLM scraped itself, and gpudash attached to it with the probe
        vp, gp = next(ports), next(ports)
        procs.append(_double("127.0.0.6", vp, "facebook/opt-125m"))
        d = box_dir("vllm")
        (d / "gpudash.toml").write_text('[prometheus]\nservers = "all"\n\n' + PROBE + f'[[servers]]\nname = "chat"\nkind = "vllm"\n'
                                                f'url = "http://127.0.0.6:{vp}"\nprobe = true\n')
        procs.append(gpudash(d, "serve", "--config", str(d / "gpudash.toml"), "--sim", "h200", "--db", str(d / "g.db"),
                             "--prometheus", f"127.0.0.6:{gp}", "--quiet"))
        add("vllm", f"127.0.0.6:{vp}", "vllm")
        add("gpudash", f"127.0.0.6:{gp}", "gpudash sim:h200")
        # 127.0.0.7: nothing listens
        add("gpudash", f"127.0.0.7:{next(ports)}", "nothing")
        prom = start_prometheus(tmp / "prometheus", jobs, rules=(RULES, ALERTS_NOW), self_scrape=True,
                                port=next(ports))
        procs.append(prom.proc)
        rig = FleetRig(prom, targets, procs, tmp)

        seen: dict[str, object] = {}

        def scraped() -> bool:
            up = {r["metric"]["instance"]: r["value"][1] for r in prom.query("up")}
            want = {i for i, w in targets.items() if w != "nothing"}
            seen["not up"] = sorted(want - {i for i, v in up.items() if v == "1"})
            seen["ready"] = [r["metric"]["server"] for r in prom.query('gpudash_server_state{state="ready"} == 1')]
            seen["probed"] = [r["metric"]["server"] for r in prom.query(
                "sum by (server) (rate(gpudash_server_probe_ttft_seconds_count[5m])) > 0 and on(server) "
                "sum by (server) (rate(gpudash_server_probe_prompt_tokens_total[5m])) > 0")]
            return not seen["not up"] and len(seen["ready"]) == 2 and len(seen["probed"]) == 2

        for p in procs:
            assert p.poll() is None, p.args
        try:
            wait_for(scraped, 120, "every target scraped, both attached servers ready and probed")
        except AssertionError as err:
            raise AssertionError(f"{err}: {seen}") from None
        time.sleep(3)  # a few more scrapes, so rate() windows hold several points
        yield rig
    finally:
        for p in reversed(procs):
            stop(p)
