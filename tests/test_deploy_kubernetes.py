"""`gpudash deploy kubernetes` writes manifests a cluster accepts, checked offline: the DaemonSet and Service
against the Kubernetes API schemas the kubernetes-validate package bundles (strict: an unknown field is an
error), for the oldest and newest release it has; the ServiceMonitor and PrometheusRule against the
prometheus-operator's own CRD schemas (tests/deploy_k8s/, PROVENANCE.txt there), made strict the same way.
The pieces fit together (selectors, port names), the PrometheusRule carries exactly what `deploy rules`
writes, and the container's arguments run as gpudash (a sim rig for --no-sim). Nothing here ran on a cluster."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpudash.launcher.health import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent / "cli"))
from cli_helpers import cmd, env  # noqa: E402

CRDS = Path(__file__).resolve().parent / "deploy_k8s"
KUBERNETES = ("1.25.0", kubernetes_validate.latest_version())
IMAGE = "registry.example.com/ops/gpudash:0.1.0"


def deploy(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudash", "deploy", *args], capture_output=True, text=True,
                          cwd=tmp, timeout=120)


def strict(schema: object) -> object:
    """The schema with every object that lists its properties closed to others (the API server prunes
    unknown fields of a CRD silently; a test wants them found)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and \
                not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_valid(doc: dict) -> None:
    schema = json.loads((CRDS / f"monitoring.coreos.com_v1_{doc['kind'].lower()}.json").read_text())
    jsonschema.Draft7Validator(strict(schema)).validate(doc)


@pytest.fixture
def objects(tmp_path: Path) -> dict[str, dict]:
    r = deploy(tmp_path, "kubernetes", "--out", str(tmp_path / "k8s"), "--image", IMAGE, "--job", "gpu-metrics")
    assert r.returncode == 0, r.stderr
    docs = [d for p in sorted((tmp_path / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs) == 4
    return by_kind


def test_each_object_is_valid_for_its_schema(objects: dict[str, dict]) -> None:
    for version in KUBERNETES:
        for kind in ("DaemonSet", "Service"):
            kubernetes_validate.validate(objects[kind], version, strict=True)
    crd_valid(objects["ServiceMonitor"])
    crd_valid(objects["PrometheusRule"])


def test_the_validation_finds_a_misspelt_field(objects: dict[str, dict]) -> None:
    """The control: the same checks refuse an object with one field misspelt."""
    ds = copy.deepcopy(objects["DaemonSet"])
    ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBERNETES[-1], strict=True)
    sm = copy.deepcopy(objects["ServiceMonitor"])
    sm["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        crd_valid(sm)


def test_the_objects_fit_together_and_carry_the_rules(objects: dict[str, dict], tmp_path: Path) -> None:
    ds, svc, sm, rule = (objects[k] for k in ("DaemonSet", "Service", "ServiceMonitor", "PrometheusRule"))
    pod = ds["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["image"] == IMAGE and pod["spec"]["runtimeClassName"] == "nvidia"
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (port,) = container["ports"]
    assert svc["spec"]["ports"][0]["targetPort"] == port["name"] == sm["spec"]["endpoints"][0]["port"]
    rules = deploy(tmp_path, "rules", "--job", "gpu-metrics")
    assert rule["spec"] == yaml.safe_load(rules.stdout) and "gpu-metrics" in rules.stdout


def test_the_containers_arguments_run(objects: dict[str, dict], tmp_path: Path) -> None:
    (container,) = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "record" and args[args.index("--prometheus") + 1] == "0.0.0.0:9401"
    args = [a for a in args if a != "--no-sim"] + ["--sim", "h200", "--duration", "2"]
    args[args.index("--prometheus") + 1] = f"127.0.0.1:{free_port()}"
    e = {**env(tmp_path), **{v["name"]: v["value"].replace("/var/lib/gpudash", str(tmp_path / "data"))
                             for v in container["env"]}}
    r = subprocess.run(cmd(*args), capture_output=True, text=True, env=e, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert list((tmp_path / "data").rglob("*.db"))  # the store went to the pod's volume


def test_image_is_for_kubernetes_only_and_a_reference(tmp_path: Path) -> None:
    assert deploy(tmp_path, "rules", "--image", IMAGE).returncode == 2
    bad = deploy(tmp_path, "kubernetes", "--image", "x\ny: 1", "--out", str(tmp_path / "k"))
    assert bad.returncode == 2 and "--image" in bad.stderr and not (tmp_path / "k").exists()
