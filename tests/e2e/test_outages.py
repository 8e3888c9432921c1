"""A service's database goes away for a while: nothing fails, nothing is lost, and the work resumes.

While the gateway's database is out, its API answers 503 with Retry-After (never a 500), an open
event stream keeps its keep-alives going, and the stage events it cannot project wait in its
queue. While a stage's database is out, that stage's events wait. Afterwards every pipeline ends
SUCCEEDED and nothing is in the dead-letter queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from castad_contracts import topology
from castad_faults import outage
from castad_testkit import briefs

from tests.e2e.conftest import SHARED, STAGES, RunningCastad, SharedCastad, castad_of, view_of

pytestmark = pytest.mark.e2e

OUTAGE_S = 6  # longer than CASTAD_HANDLER_RETRIES (1) of failing handler tries would last
# One attempt per stage: an outage that cost an attempt would fail its pipeline.
ONE_ATTEMPT = {f"CASTAD_{stage}_MAX_ATTEMPTS": "1" for stage in STAGES}


@pytest.fixture(scope="module")
def outages_castad(migrated_templates, tmp_path_factory) -> Iterator[RunningCastad]:
    """One Castad for the module's outages: each test's outage is over, and the services back, when it ends."""
    with castad_of(migrated_templates, tmp_path_factory.mktemp("outages"), {**SHARED, **ONE_ATTEMPT}) as running:
        yield running


@pytest.fixture
def stack(outages_castad: RunningCastad) -> Iterator[SharedCastad]:
    yield from view_of(outages_castad)


@pytest.mark.timeout(180)
def test_the_gateway_database_out_mid_run_gives_503s_and_then_every_pipeline_completes(stack):
    running, dbs, broker, installation = stack, stack.dbs, stack.broker, stack.installation
    running.faults("lyric", latency_s=0.5)  # pipelines still running when the outage starts
    ids = [running.submit(briefs.sample(f"가게 {n}")) for n in range(4)]
    streamed: dict[str, list] = {pid: [] for pid in ids[:2]}

    def follow(pipeline_id: str) -> None:
        for _, data in running.client.events(pipeline_id):
            streamed[pipeline_id].append(data)

    followers = [threading.Thread(target=follow, args=(pid,)) for pid in streamed]
    for follower in followers:
        follower.start()
    running.wait_until("both event streams open", lambda: all(streamed.values()))
    running.wait_until("a lyric attempt running", lambda: dbs.jobs_of("lyric", ids))

    with outage.database_down(installation.database_urls["api"]):
        time.sleep(0.5)
        refused = running.http.post(
            "/v1/pipelines",
            content=briefs.sample("늦은 가게").model_dump_json(),
            headers={"Content-Type": "application/json", "Idempotency-Key": "during-the-outage"},
        )
        read = running.http.get(f"/v1/pipelines/{ids[0]}")
        time.sleep(OUTAGE_S)

    assert (refused.status_code, refused.headers.get("Retry-After")) == (503, "2")
    assert "unavailable" in refused.json()["detail"]
    assert read.status_code == 503
    late = running.submit(briefs.sample("늦은 가게"), key="during-the-outage")  # the client tries again
    views = running.wait_terminal([*ids, late], timeout_s=120)

    assert {view.status for view in views.values()} == {"SUCCEEDED"}
    for follower in followers:
        follower.join(30)
    for events in streamed.values():
        assert events[-1]["pipeline_status"] == "SUCCEEDED"
    assert broker.ready(installation.topology.dead_letter_queue) == 0
    assert dbs.rows("api", dbs.dead_letters.select()) == []  # none recorded by the gateway either


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stage", topology.STAGES)
def test_a_stage_database_out_mid_run_costs_no_attempt(stack, stage):
    running, dbs, broker, installation = stack, stack.dbs, stack.broker, stack.installation
    ids = [running.submit(briefs.sample(f"가게 {n}")) for n in range(3)]

    with outage.database_down(installation.database_urls[stage]):
        more = [running.submit(briefs.sample(f"또 다른 가게 {n}")) for n in range(3)]
        time.sleep(OUTAGE_S)

    views = running.admin.wait_terminal([*ids, *more], timeout_s=120)

    assert {view.status for view in views.values()} == {"SUCCEEDED"}, [
        (view.current_stage, view.error_code, view.error_message) for view in views.values() if view.error_code
    ]
    assert broker.ready(installation.topology.dead_letter_queue) == 0
    assert dbs.rows("api", dbs.dead_letters.select()) == []  # none recorded by the gateway either
    with httpx.Client(base_url=running.base_url) as http:
        assert http.get("/readyz").status_code == 200
