"""The fault checker's time bound: from the last fault's end, or from a later acceptance or operator retry."""

from __future__ import annotations

import datetime
import types

from castad_faults import checker

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def test_the_bound_runs_from_the_latest_of_fault_end_acceptance_and_last_retry():
    fault_end = at(100).timestamp()
    snapshot = types.SimpleNamespace(
        outbox={
            "api": [
                {"pipeline_id": "p", "routing_key": "pipeline.requested", "created_at": at(0)},
                {"pipeline_id": "p", "routing_key": "pipeline.retry_requested", "created_at": at(500)},
                {"pipeline_id": "p", "routing_key": "pipeline.retry_requested", "created_at": at(900)},
                {"pipeline_id": "q", "routing_key": "pipeline.cancel_requested", "created_at": at(950)},
            ]
        }
    )
    retries = checker.last_retries(snapshot)  # type: ignore[arg-type]
    assert retries == {"p": at(900).timestamp()}

    retried = {"created_at": at(0), "finished_at": at(960)}
    assert checker.lateness("p", retried, retries, fault_end) == 60  # from its last retry
    during = {"created_at": at(50), "finished_at": at(400)}
    assert checker.lateness("q", during, retries, fault_end) == 300  # from the end of the faults
    later = {"created_at": at(700), "finished_at": at(730)}
    assert checker.lateness("r", later, retries, fault_end) == 30  # from its acceptance
