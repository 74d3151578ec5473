"""deploy/grafana/gpudash.json is generated from gpudash/fleet/dashboard.py: regenerating it gives the same
bytes (so nobody hand-edits the JSON), and it is a dashboard Grafana can import."""

from __future__ import annotations

import json
from pathlib import Path

from gpudash.fleet import dashboard, queries

FILE = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpudash.json"


def test_the_shipped_dashboard_is_the_generated_one() -> None:
    assert FILE.read_text(encoding="utf-8") == dashboard.render(), (
        "deploy/grafana/gpudash.json differs from its definition: run "
        "`python -m gpudash.fleet.dashboard deploy/grafana/gpudash.json`")


def test_the_dashboard_is_importable_and_shares_the_fleet_queries() -> None:
    doc = json.loads(FILE.read_text(encoding="utf-8"))
    assert doc["uid"] == "gpudash-fleet" and doc["schemaVersion"] >= 36
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names == ["datasource", "instance"]
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])  # ids are unique
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        (target,) = p["targets"]
        assert "{sel}" not in target["expr"] and target["datasource"]["uid"] == "${datasource}"
    exprs = {p["targets"][0]["expr"] for p in panels}
    # The CLI's per-box and per-server figures are the dashboard's, to the character.
    for name in ("util", "mem_used", "tx", "rx"):
        assert queries.fill(queries.BOX[name], dashboard.SEL) in exprs
    for name in ("ttft_p90", "hit_rate", "kv"):
        assert queries.fill(queries.SERVER[name], dashboard.SEL) in exprs
