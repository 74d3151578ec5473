"""The fleet every test in this folder may use: Debian's Prometheus scraping three `gpudash record --sim`
boxes of different profiles, one `gpudash serve` box with the vLLM test double attached and probed, a
target that exports no gpudash metrics (Prometheus itself) and one that never answers, all on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from fleet_helpers import ALERTS_NOW, DOUBLE, PROFILES, RULES, FleetRig, binary, gpudash, start_prometheus, stop, wait_for
from cli_helpers import free_ports  # noqa: E402 (fleet_helpers puts tests/cli on the path)


@pytest.fixture(scope="module")
def fleet_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRig]:
    binary("prometheus")
    tmp = tmp_path_factory.mktemp("fleet")
    procs: list[subprocess.Popen] = []
    boxes: dict[str, str] = {}
    ports = iter(free_ports(len(PROFILES) + 4))  # the boxes, the vLLM double, the dead target, Prometheus
    try:
        for profile in PROFILES:
            port = next(ports)
            box = tmp / profile.replace("+", "_")
            box.mkdir()
            procs.append(gpudash(box, "record", "--sim", profile, "--interval", "0.5", "--db", str(box / "g.db"),
                                 "--prometheus", f"127.0.0.1:{port}", "--quiet"))
            boxes[f"127.0.0.1:{port}"] = f"sim:{profile}"
        vport, sport = next(ports), next(ports)
        vbox = tmp / "vllm"
        vbox.mkdir()
        procs.append(subprocess.Popen([sys.executable, str(DOUBLE), "serve", "facebook/opt-125m", "--host",
                                       "127.0.0.1", "--port", str(vport), "--enable-prompt-tokens-details"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        (vbox / "gpudash.toml").write_text(
            f'[probe]\ninterval_s = 0.5\nprompt_tokens = 64\nmax_tokens = 2\nshared_prefix = 0.8\n\n'
            f'[[servers]]\nname = "chat"\nkind = "vllm"\nurl = "http://127.0.0.1:{vport}"\nprobe = true\n')
        procs.append(gpudash(vbox, "serve", "--config", str(vbox / "gpudash.toml"), "--sim", "h200",
                             "--db", str(vbox / "g.db"), "--prometheus", f"127.0.0.1:{sport}", "--quiet"))
        boxes[f"127.0.0.1:{sport}"] = "vllm"
        dead = f"127.0.0.1:{next(ports)}"  # nothing listens here
        boxes[dead] = "nothing"
        prom = start_prometheus(tmp / "prometheus", {"gpudash": list(boxes)}, rules=(RULES, ALERTS_NOW),
                                self_scrape=True, port=next(ports))
        procs.append(prom.proc)
        boxes[prom.url.removeprefix("http://")] = "prometheus"
        rig = FleetRig(prom, boxes, procs, tmp)

        def scraped() -> bool:
            up = {r["metric"]["instance"]: r["value"][1] for r in prom.query("up")}
            ready = {i for i, v in up.items() if v == "1"}
            want = {b for b, w in boxes.items() if w != "nothing"}
            served = prom.query('gpudash_server_state{state="ready"} == 1')
            hist = prom.query("sum(rate(gpudash_server_request_ttft_seconds_count[5m])) > 0")
            return want <= ready and bool(served) and bool(hist)

        for p in procs:
            assert p.poll() is None, p.args
        wait_for(scraped, 90, "every box scraped, the vLLM double ready and probed")
        time.sleep(3)  # a few more scrapes, so rate() windows hold several points
        yield rig
    finally:
        for p in reversed(procs):
            stop(p)
