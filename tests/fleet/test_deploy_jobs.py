"""`gpudash deploy rules --job NAME`: the fleet's job names are the operator's. A job that the shipped list
does not name and whose every target is down (so it exports none of the fleet's series, and the rules'
fallback cannot see it) alerts once --job names it, and only then; a dot in a name matches only a dot.
Evaluated by promtool's own rule unit tests, the same engine as the real Prometheus."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fleet_helpers import binary

UNIT_TEST = """\
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{{instance="g:9400",job="gpu-metrics"}}'
        values: '0x10'
      - series: 'up{{instance="m:9400",job="my.box"}}'
        values: '0x10'
      - series: 'up{{instance="x:9400",job="myxbox"}}'
        values: '0x10'
      - series: 'up{{instance="n:9100",job="node"}}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 5m
        alertname: GpudashBoxDown
        exp_alerts:{expected}
"""
FIRING = """
          - exp_labels: {instance: "g:9400", job: gpu-metrics, severity: critical}
            exp_annotations:
              summary: "gpu-metrics on g:9400 does not answer scrapes"
              description: "Prometheus cannot scrape this target: the box, its exporter or the network between is down."
              runbook_url: https://github.com/gpudash/gpudash/blob/main/deploy/RUNBOOK.md#gpudashboxdown
          - exp_labels: {instance: "m:9400", job: my.box, severity: critical}
            exp_annotations:
              summary: "my.box on m:9400 does not answer scrapes"
              description: "Prometheus cannot scrape this target: the box, its exporter or the network between is down."
              runbook_url: https://github.com/gpudash/gpudash/blob/main/deploy/RUNBOOK.md#gpudashboxdown"""


def _promtool_test(tmp_path: Path, deploy_args: list[str], expected: str) -> subprocess.CompletedProcess:
    rules = subprocess.run([sys.executable, "-m", "gpudash", "deploy", "rules", *deploy_args], capture_output=True,
                           text=True, cwd=tmp_path, timeout=120)
    assert rules.returncode == 0, rules.stderr
    (tmp_path / "rules.yml").write_text(rules.stdout)
    (tmp_path / "test.yml").write_text(UNIT_TEST.format(rules="rules.yml", expected=expected))
    return subprocess.run([binary("promtool"), "test", "rules", "test.yml"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)


def test_jobs_named_by_job_alert_when_down(tmp_path: Path) -> None:
    named = _promtool_test(tmp_path, ["--job", "gpu-metrics", "--job", "my.box"], FIRING)
    assert named.returncode == 0 and "SUCCESS" in named.stdout, named.stdout + named.stderr


def test_without_job_those_jobs_stay_silent(tmp_path: Path) -> None:
    """The control: the shipped list does not name them, so the alert above came from --job."""
    shipped = _promtool_test(tmp_path, [], " []")
    assert shipped.returncode == 0 and "SUCCESS" in shipped.stdout, shipped.stdout + shipped.stderr
