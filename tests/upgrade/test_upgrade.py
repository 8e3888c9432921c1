"""A rolling upgrade from the release before to this tree, in short: `make test` runs it, `make upgrade-test SHORT=1`
alone (`make upgrade-test` runs the full one and writes docs/reports/upgrade.md).

It starts thirteen service processes and takes about 110 s, most of it waiting on its pipelines: `make test` hands
it out last, so that it runs beside the fault suite, which leaves a core mostly idle (tests/conftest.py).

The earlier release installed from git beside this one, the schema migrated to this one's, every service rolled in
CHANGELOG.md's order with a new replica beside the old one before the old one stops, under steady traffic with
photos, cancels and retries, judged by the fault checker's invariants.
"""

from __future__ import annotations

import pytest
from castad_testkit import scratch

from bench.upgrade import releases, report, run
from tests.support import servers

pytestmark = [pytest.mark.e2e, pytest.mark.upgrade]


@pytest.mark.timeout(900)
def test_every_pipeline_ends_in_one_known_outcome_through_a_rolling_upgrade_from_the_release_before(
    tmp_path, monkeypatch
):
    servers.require_servers()
    monkeypatch.setattr(scratch, "PG_URL", servers.PG_URL)  # the tests' own server

    result = run.run(releases.previous(), run.SHORT, tmp_path)

    report.write(result, tmp_path / "upgrade.md")
    assert result.findings == [], f"{len(result.findings)} findings; report and logs in {tmp_path}"
    mixes = [set(phase.running.values()) for phase in result.phases]
    assert mixes[0] == {result.old.name} and mixes[-1] == {"HEAD"}
    assert sum(mix == {result.old.name, "HEAD"} for mix in mixes) >= 5  # each group old and new side by side
    assert all(phase.accepted for phase in result.phases)
    assert all(outcome in run.checker.TERMINAL for outcome in result.outcomes.values())
