"""The charts, ready to render: one copy of infra/helm per test session."""

from __future__ import annotations

import pathlib
import shutil

import helm_python as helm
import pytest
from castad_contracts import topology
from castad_local import REPO_ROOT


@pytest.fixture(scope="session")
def chart_dir(tmp_path_factory) -> pathlib.Path:
    """A copy of infra/helm with every chart's file:// dependencies vendored (helm dependency update)."""
    root = tmp_path_factory.mktemp("helm") / "helm"
    shutil.copytree(REPO_ROOT / "infra" / "helm", root)
    for name in (*topology.SERVICES, "castad"):
        helm.dependency_update(root / name)
    return root
