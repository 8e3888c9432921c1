"""Render the charts as `helm install` does and read what came out.

Rendering uses Helm's own Go SDK (helm-python-sdk), so templates, values.schema.json and `fail`
behave as at `helm install`.
"""

from __future__ import annotations

import pathlib
from typing import Any

import helm_python as helm
import yaml

KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")  # the charts' kubeVersion floor, and the newest schemas at hand


def render(chart_dir: pathlib.Path, name: str, values: dict[str, Any], *, upgrade: bool = False) -> list[dict]:
    """Every manifest the chart renders with `values`, as a release `prod` in namespace `media`."""
    chart = helm.Chart.load(chart_dir / name)
    chart.validate_schema(values)  # what `helm install` does before rendering
    rendered = chart.render(
        values, name="prod", namespace="media", revision=2 if upgrade else 1, is_install=not upgrade, is_upgrade=upgrade
    )
    documents = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            assert "castad" in text
            continue
        documents += [doc for doc in yaml.safe_load_all(text) if doc]
    return documents


def by_kind(documents: list[dict], kind: str) -> list[dict]:
    return [doc for doc in documents if doc["kind"] == kind]


def env_of(container: dict) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}
