"""`gpudash deploy kubernetes`: the Kubernetes manifests of deploy/kubernetes/ (a DaemonSet on the GPU nodes,
its Service and ServiceMonitor, and the alert rules as a PrometheusRule), with the image, this version and
the rules filled in. The rules go in as the text of gpudash-rules.yml indented under `spec:`, so the
PrometheusRule says exactly what `gpudash deploy rules` says, comments included, with no YAML writer."""

from __future__ import annotations

import importlib.metadata


def version() -> str:
    try:
        return importlib.metadata.version("gpudash")
    except importlib.metadata.PackageNotFoundError:  # a checkout run with PYTHONPATH, never installed
        return "unknown"


def default_image() -> str:
    """No image is published: this is the name the README's build instructions give one."""
    return f"gpudash:{version()}"


def under_spec(rules: str) -> str:
    """The rules file's text as the value of `spec:` (every non-empty line two spaces deeper)."""
    return "".join("  " + line if line.strip() else line for line in rules.splitlines(keepends=True))


def render(template: str, image: str, rules: str) -> str:
    text = template.replace("@VERSION@", version()).replace("@IMAGE@", image)
    return text.replace("@RULES@\n", under_spec(rules))
