"""The README stays a newcomer's first five minutes.

The docs list every setting as the settings classes define them.
"""

from __future__ import annotations

import re

from castad_local import REPO_ROOT, admin


def test_the_settings_page_lists_every_setting_as_the_settings_classes_define_it():
    page = (REPO_ROOT / "docs" / "operating" / "settings.md").read_text()
    documented = re.search(r"<!-- settings:begin -->\n(.*?)\n<!-- settings:end -->", page, re.S)
    assert documented, "docs/operating/settings.md lost its settings markers"
    assert documented.group(1) == admin.settings_table(), "regenerate with: .venv/bin/castad-admin settings"


def test_the_readme_starts_with_the_two_commands():
    readme = (REPO_ROOT / "README.md").read_text()
    commands = re.findall(r"^(make \w+)\b", readme, re.M)
    assert commands[:2] == ["make demo", "make test"]


def test_the_readme_is_read_in_five_minutes():
    readme = (REPO_ROOT / "README.md").read_bytes()
    assert len(readme) < 12 * 1024, "move what a newcomer does not need first into docs/"
    assert readme.count(b"\n") < 200, "move what a newcomer does not need first into docs/"


def test_the_failures_page_lists_every_error_code_with_its_meaning():
    page = (REPO_ROOT / "docs" / "operating" / "failures.md").read_text()
    documented = re.search(r"<!-- error-codes:begin -->\n(.*?)\n<!-- error-codes:end -->", page, re.S)
    assert documented, "docs/operating/failures.md lost its error-codes markers"
    assert documented.group(1) == admin.error_codes_table(), "regenerate with: .venv/bin/castad-admin error-codes"
