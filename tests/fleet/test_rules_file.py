"""What an on-call person gets from every shipped alert: a severity, a summary, a description and a runbook_url
that points at a section of deploy/RUNBOOK.md (which the package ships), and a promtool unit test with a case
where it fires and a case where it must stay silent. Critical alerts are the page-worthy kinds only. The
promtool run itself is in test_fleet_prometheus.py; this file holds the coverage and the runbook's links."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from gpudash.gpu.xid import XID_MEANING

from fleet_helpers import REPO, RULES, binary

RUNBOOK = REPO / "deploy" / "RUNBOOK.md"
UNIT_TESTS = REPO / "tests" / "fleet" / "rules_test.yml"
BASE = "https://github.com/gpudash/gpudash/blob/main/deploy/RUNBOOK.md#"


def _alerts() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def _anchors() -> set[str]:
    """GitHub's anchors of the runbook's headings (lower case, spaces to dashes, punctuation dropped)."""
    heads = re.findall(r"^#{1,6} (.+)$", RUNBOOK.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in heads}


def test_every_alert_says_what_it_means_and_links_its_runbook_section() -> None:
    anchors = _anchors()
    for rule in _alerts():
        name, ann = rule["alert"], rule.get("annotations", {})
        assert {"summary", "description", "runbook_url"} <= set(ann), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        url = ann["runbook_url"]
        assert url.startswith(BASE) and url.removeprefix(BASE) in anchors, (name, url)
        assert url.removeprefix(BASE) == name.lower(), name  # one section per alert, named after it
    assert len(anchors - {"gpudash-runbook"}) == len(_alerts())  # and no section for an alert that is gone


def test_every_alert_has_a_firing_and_a_silent_promtool_case() -> None:
    cases = [c for t in yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))["tests"]
             for c in t.get("alert_rule_test", ())]
    for name in (r["alert"] for r in _alerts()):
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"{name} has no case where it fires"
        assert any(c.get("exp_alerts") == [] for c in mine), f"{name} has no case where it must stay silent"


def test_only_an_application_xid_is_info_and_unknown_ones_page() -> None:
    """The rules' application Xids are ones gpudash names (gpu/xid.py), every other is classed hardware."""
    (rule,) = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
               if r.get("record") == "gpudash:gpu_last_xid:info"]
    application = re.search(r'"class", "application", "xid", "([0-9|]+)"', rule["expr"]).group(1).split("|")
    assert {int(x) for x in application} <= set(XID_MEANING) | {8}
    assert not {"48", "79", "63", "64", "74", "92", "94", "95", "119", "120", "140"} & set(application)
    assert '"class", "hardware", "class", ""' in rule["expr"]  # the rest, unknown Xids too


def test_the_runbook_ships_with_the_rules(tmp_path: Path) -> None:
    out = subprocess.run([binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    shown = subprocess.run([sys.executable, "-m", "gpudash", "deploy", "runbook"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120)
    assert shown.returncode == 0 and shown.stdout == RUNBOOK.read_text(encoding="utf-8"), shown.stderr
