"""The promise under every kind of fault, in short.

The fault harness's SHORT plan (`make faults` runs the full one and writes docs/reports/faults.md). Every service
in replicas on a 3-node RabbitMQ cluster and a PostgreSQL primary with two synchronous standbys; at least 100
pipelines; every fault kind once, outages of 6 s, the kills and the database outages of every service at once, and
every invariant the full run checks (the handoffs of its quiet phase are measured by `make faults` alone).
"""

from __future__ import annotations

import pytest
from castad_faults import freezes, outcome, plan, report, run

from tests.support.servers import require_servers

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(1200)
def test_every_accepted_pipeline_ends_in_one_known_outcome_whatever_fails(tmp_path):
    require_servers()

    result = run.run(plan.SHORT, tmp_path)

    report.write(result, tmp_path / "faults.md")  # the report and its chart, as `make faults` writes them
    assert result.findings == [], f"{len(result.findings)} findings; report and logs in {tmp_path}"
    assert len(result.snapshot.pipelines) >= plan.SHORT.pipelines
    assert {fault.kind for fault in result.faults} >= {
        "kill -9",
        "SIGTERM mid-render",
        "database outage",
        "connections cut",
        "connections stalled",
        *outcome.NODE_LOSS,
        outcome.FAILOVER,
        outcome.FROZEN_IN_TRANSACTION,
        outcome.STANDBY_LOSS,
    }
    frozen = [fault for fault in result.faults if fault.kind == outcome.FROZEN_IN_TRANSACTION]
    assert {fault.target.rsplit("-", 1)[0] for fault in frozen} == {*freezes.FROZEN_IN_TRANSACTION_SERVICES, "relay"}
    # PostgreSQL ended each frozen session, letting go of its row locks, within its timeout (the takeover bound).
    assert all(fault.takeover_s is not None for fault in frozen), frozen
    killed = {fault.target.rsplit("-", 1)[0] for fault in result.faults if fault.kind == "kill -9"}
    assert killed == set(run.PROCESSES)
    assert {fault.target for fault in result.faults if fault.kind == "database outage"} == set(run.SERVICES)
    assert all(fault.recovered_s is not None for fault in result.faults), [f for f in result.faults]
    assert all(fault.takeover_s is not None for fault in result.faults if fault.takeover_bound_s), result.faults
