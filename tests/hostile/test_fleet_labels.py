"""Issue 37 items 5 (the fleet's part) and 6: labels from a fleet are text from outside.

End to end: a real Prometheus scrapes `gpudash record --prometheus` running under a hostile host name (a
UTS namespace of its own with sethostname when this runs as root, else NODE_NAME, which gpudash reads as
dcgm-exporter does), the vLLM double serving a hostile model name, under a hostile `instance` set by
relabelling, and fires an alert with a hostile name. `gpudash fleet` and the Fleet tab must show every one
as text: no escape sequence reaches the terminal and no Rich markup is interpreted ([/] once raised
MarkupError). Then `gpudash fleet` against a fake Prometheus answering odd JSON: a non-string instance, a
null alertname, a list where a number goes, JSON nested too deeply: a table or one line, never a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "fleet"))
sys.path.insert(0, str(TESTS / "cli"))
sys.path.insert(0, str(TESTS / "tui"))
from cli_helpers import env, free_ports, run  # noqa: E402
from fleet_helpers import DOUBLE, binary, serving, start_prometheus, stop, wait_for  # noqa: E402

HOST = "\x1b]0;pwned\x07[link=file:///etc/shadow]x[/link][/]"  # sets the title, rings, links a file
MODEL = "m\x1b[2J\x1b[31m[bold]red[/bold][/]"  # clears the screen, colours, markup
INSTANCE = "\x1b]2;inst\x07[blink]i[/]:8000"
ALERT = "Evil\x1b[5m[link=http://x]A[/link]"
CONTROL = [chr(c) for c in range(32) if chr(c) != "\n"] + ["\x7f", "\x9b"]


def no_control(text: str) -> None:
    bad = sorted({c for c in text if c in CONTROL})
    assert bad == [], bad


def as_shown(text: str) -> str:
    """How gpudash shows a label: control characters as their escapes (gpudash/outside.py)."""
    from gpudash.outside import printable

    return printable(text)


@pytest.fixture(scope="module")
def hostile_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    binary("prometheus")
    tmp = tmp_path_factory.mktemp("hostile-fleet")
    box, vport, pport = free_ports(3)
    rules = tmp / "evil.yml"
    rules.write_text(json.dumps({"groups": [{"name": "evil", "rules": [
        {"alert": ALERT, "expr": 'up{job="vllm"} == 1', "labels": {"severity": "info"}}]}]}))
    cmd = [sys.executable, "-c", "from gpudash.cli import main; main()", "record", "--sim", "h200", "--interval",
           "0.5", "--db", str(tmp / "g.db"), "--prometheus", f"127.0.0.1:{box}", "--quiet"]
    unshare = shutil.which("unshare")
    box_env = env(tmp)
    if os.geteuid() == 0 and unshare:  # a real host name, in a UTS namespace of its own
        cmd = [unshare, "-u", sys.executable, "-c", "import os, socket, sys; socket.sethostname(sys.argv[1]); "
               "os.execv(sys.argv[2], sys.argv[2:])", HOST, *cmd]
    else:
        box_env["NODE_NAME"] = HOST
    procs = [subprocess.Popen(cmd, env=box_env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
             subprocess.Popen([sys.executable, str(DOUBLE), "serve", MODEL, "--host", "127.0.0.1", "--port",
                               str(vport)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        prom = start_prometheus(tmp / "prometheus", {"gpudash": [f"127.0.0.1:{box}"], "vllm": [f"127.0.0.1:{vport}"]},
                                rules=(rules,), port=pport,
                                relabel={"vllm": [{"target_label": "instance", "replacement": INSTANCE}]})
        procs.append(prom.proc)
        wait_for(lambda: prom.query("gpudash_box_info") and prom.query("vllm:num_requests_running")
                 and prom.query('ALERTS{alertstate="firing"}'), 60, "both scraped and the alert firing")
        yield prom.url, tmp
    finally:
        for p in reversed(procs):
            stop(p)


def test_fleet_shows_hostile_labels_as_text(hostile_fleet: tuple[str, Path]) -> None:
    url, tmp = hostile_fleet
    doc = json.loads(run(tmp, "fleet", "--prometheus", url, "--json").stdout)  # JSON keeps them exactly
    hosts = {b["hostname"] for b in doc["boxes"]}
    assert HOST in hosts
    servers = [s for b in doc["boxes"] for s in b["servers"]]
    assert [s["server"] for s in servers] == [MODEL]
    assert any(a == ALERT for b in doc["boxes"] for a in b["alerts"])
    table = run(tmp, "fleet", "--prometheus", url)
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr
    no_control(table.stdout)
    for label in (HOST, MODEL, ALERT, INSTANCE.rsplit(":", 1)[0]):
        # shown with its escapes visible and its markup as typed (the table folds a long cell: its start)
        assert as_shown(label)[:24] in table.stdout, (label, table.stdout)


@pytest.mark.anyio
async def test_the_fleet_tab_shows_hostile_labels_as_text(hostile_fleet: tuple[str, Path]) -> None:
    from textual.widgets import Static

    from fixtures import FixedFeed, sim_snapshot
    from tui_helpers import wait_for as tui_wait

    from gpudash.config import Config
    from gpudash.tui.app import GpudashApp
    from gpudash.tui.widgets.fleet import BoxScreen, FleetView
    from gpudash.tui.widgets.lines import TextLines

    url, _ = hostile_fleet

    class Feed(FixedFeed):
        config = Config.model_validate({"fleet": {"prometheus": url}})

    app = GpudashApp(Feed([sim_snapshot(tick=1)]))
    async with app.run_test(size=(200, 40)) as pilot:
        await tui_wait(pilot, lambda: app.info is not None, what="the feed")
        await pilot.press("0")
        view = app.query_one("#fleet-view", FleetView)
        await tui_wait(pilot, lambda: len(view.rows) == 2, timeout=20, what="both boxes")
        lines = "\n".join(line.plain for line in view.query_one("#fleet-lines", TextLines).lines)
        no_control(lines)
        assert as_shown(HOST)[:30] in lines and as_shown(ALERT)[:20] in lines
        view.cursor = next(i for i, b in enumerate(view._shown) if b.servers)
        await pilot.press("enter")
        await tui_wait(pilot, lambda: isinstance(app.screen, BoxScreen), what="the box screen")
        head = str(app.screen.query_one("#box-title", Static).content)
        no_control(head)
        assert as_shown(ALERT) in head


# ---- a fake Prometheus answering odd JSON ------------------------------------------------------------------

def _vector(*rows: dict) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": list(rows)}}).encode()


ODD = {
    "non-string instance": _vector({"metric": {"gpudash_q": "up", "instance": 5, "job": "gpudash"}, "value": [1, "1"]},
                                   {"metric": {"gpudash_q": "member.gpudash", "instance": ["x"], "job": "gpudash"},
                                    "value": [1, "1"]}),
    "null alertname": _vector({"metric": {"gpudash_q": "up", "instance": "a:1", "job": "gpudash"}, "value": [1, "1"]},
                              {"metric": {"gpudash_q": "member.gpudash", "instance": "a:1", "job": "gpudash"},
                               "value": [1, "1"]},
                              {"metric": {"gpudash_q": "alerts", "instance": "a:1", "alertname": None},
                               "value": [1, "1"]}),
    "a list for a number": _vector(
        {"metric": {"gpudash_q": "up", "instance": "a:1", "job": "gpudash"}, "value": [1, ["1"]]},
        {"metric": {"gpudash_q": "member.gpudash", "instance": "a:1", "job": "gpudash"}, "value": [[1], "1"]},
        {"metric": {"gpudash_q": "gpu.gpudash_gpu_utilization_ratio", "instance": "a:1", "UUID": "G", "gpu": "0"},
         "value": [1, {"x": 1}]}),
    "markup in a hostname": _vector(
        {"metric": {"gpudash_q": "up", "instance": "a:1", "job": "gpudash"}, "value": [1, "1"]},
        {"metric": {"gpudash_q": "member.gpudash", "instance": "a:1", "job": "gpudash"}, "value": [1, "1"]},
        {"metric": {"gpudash_q": "info", "instance": "a:1", "hostname": "[/]b[link=file:///x]", "rig": "[/"},
         "value": [1, "1"]}),
    "a GPU label of a Unicode digit": _vector(  # "²".isdigit() is true, int("²") raises
        {"metric": {"gpudash_q": "up", "instance": "a:1", "job": "gpudash"}, "value": [1, "1"]},
        {"metric": {"gpudash_q": "member.gpudash", "instance": "a:1", "job": "gpudash"}, "value": [1, "1"]},
        *({"metric": {"gpudash_q": "gpu.gpudash_gpu_utilization_ratio", "instance": "a:1", "UUID": f"G{g}", "gpu": g},
           "value": [1, "0.5"]} for g in ("²", "0", "١"))),
    "nested too deeply": b'{"status":"success","data":' + b"[" * 200_000 + b"]" * 200_000 + b"}",
}


class _Odd(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = ODD[self.server.case]  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("case", list(ODD))
def test_fleet_on_odd_json_prints_a_table_or_one_line(tmp_path: Path, case: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Odd)
    server.case = case  # type: ignore[attr-defined]
    with serving(server) as port:
        url = f"http://127.0.0.1:{port}"
        for extra in ((), ("--json",)):
            proc = run(tmp_path, "fleet", "--prometheus", url, *extra)
            assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
            if proc.returncode:
                assert proc.stderr.startswith("gpudash: ") and proc.stderr.count("\n") == 1, proc.stderr
            no_control(proc.stdout)
            if case == "nested too deeply":
                assert "nested too deeply" in proc.stderr
            elif case == "markup in a hostname" and not extra:
                assert "[/]b[link=file:///x]" in proc.stdout  # as typed: neither interpreted nor an error
