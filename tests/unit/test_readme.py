"""The README lists every setting exactly as the settings classes define them."""

from __future__ import annotations

import re

from castad_local import REPO_ROOT, admin


def test_the_readme_settings_table_is_current():
    readme = (REPO_ROOT / "README.md").read_text()
    documented = re.search(r"<!-- settings:begin -->\n(.*?)\n<!-- settings:end -->", readme, re.S)
    assert documented, "README.md lost its settings markers"
    assert documented.group(1) == admin.settings_table(), "regenerate with: .venv/bin/castad-admin settings"


def test_the_readme_starts_with_the_two_commands():
    readme = (REPO_ROOT / "README.md").read_text()
    commands = re.findall(r"^(make \w+)\b", readme, re.M)
    assert commands[:2] == ["make demo", "make test"]
