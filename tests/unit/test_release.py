"""One release number for every package, chart and image, set in one place and bumped everywhere at once."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tomllib

import yaml
from castad_runtime import release

ROOT = pathlib.Path(__file__).resolve().parents[2]
RELEASE = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["bumpversion"]["current_version"]


MEMBERS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]
PACKAGES = sorted(str(path.relative_to(ROOT)) for member in MEMBERS for path in ROOT.glob(f"{member}/pyproject.toml"))


def test_every_package_installed_and_every_chart_is_of_the_release():
    packages = {path: tomllib.loads((ROOT / path).read_text())["project"]["version"] for path in PACKAGES}
    assert "services/song/pyproject.toml" in packages and set(packages.values()) == {RELEASE}, packages
    installed = release.installed()
    assert set(installed) >= {"castad", "castad-api", "castad-relay", "castad-lyric", "castad-song", "castad-video"}
    assert set(installed.values()) == {RELEASE}
    assert release.of("song") == RELEASE and release.of("nothing") == release.UNKNOWN
    for chart in ROOT.glob("infra/helm/*/Chart.yaml"):
        meta = yaml.safe_load(chart.read_text())
        named = [meta["version"], meta.get("appVersion", RELEASE)]
        named += [dependency["version"] for dependency in meta.get("dependencies", [])]
        assert set(named) == {RELEASE}, chart


def test_the_changelog_has_a_section_for_the_release_and_one_for_what_comes_next():
    headings = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert headings[0] == "## Unreleased"
    assert any(heading.split()[1] == RELEASE for heading in headings[1:])


def test_a_release_would_change_every_file_that_names_it():
    """`make release`'s bump, dry: it fails if a file it is told of does not name the release where it looks."""
    bump = pathlib.Path(sys.executable).with_name("bump-my-version")
    done = subprocess.run(
        [bump, "bump", "--dry-run", "--allow-dirty", "--new-version", "99.0.0", "-v"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "300", "NO_COLOR": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    changed = set(re.findall(r"Would change file (\S+?):?\s*$", done.stdout + done.stderr, re.MULTILINE))
    assert {"pyproject.toml", "CHANGELOG.md", "infra/helm/castad/Chart.yaml", *PACKAGES} <= changed
