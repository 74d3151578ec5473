"""`gpudash fleet --json` against a real Prometheus scraping a real `gpudash record --prometheus` (sim rig) and a
target that never answers (another loopback host): the document carries `schema_version` and is valid under the fleet schema the
package ships, with a box up (its GPUs) and a box down."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema

from gpudash.commands.json_out import schema_path, schema_version
from gpudash.launcher.health import free_port

from fleet_helpers import gpudash, start_prometheus, stop, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cli_helpers import run  # noqa: E402


def test_fleet_json_is_valid_under_its_schema(tmp_path: Path) -> None:
    port, nobody = free_port(), free_port()
    box = gpudash(tmp_path, "record", "--sim", "h200", "--prometheus", f"127.0.0.1:{port}", "--quiet",
                  "--db", str(tmp_path / "g.db"))
    prom = None
    try:
        prom = start_prometheus(tmp_path / "prom", {"gpudash": [f"127.0.0.1:{port}", f"127.0.0.2:{nobody}"]})
        wait_for(lambda: len(prom.query("up")) == 2 and prom.query("gpudash_box_info"), 60, "both targets scraped")
        proc = run(tmp_path, "fleet", "--prometheus", prom.url, "--json", timeout=60)
    finally:
        if prom is not None:
            stop(prom.proc)
        stop(box)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert next(iter(doc)) == "schema_version" and doc["schema_version"] == schema_version("fleet")
    jsonschema.Draft202012Validator(json.loads(schema_path("fleet").read_text())).validate(doc)
    assert sorted(b["status"] for b in doc["boxes"]) == ["down", "up"]
