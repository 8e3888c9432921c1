"""Processes that die mid-run: the relay (events wait in outboxes) and a stage worker (its lease expires)."""

from __future__ import annotations

import datetime as dt

import pytest
from castad_contracts import topology
from castad_testkit import briefs

from tests.e2e.conftest import in_order, outbox_facts

pytestmark = pytest.mark.e2e


def _stage_event_ids(dbs, pipeline_ids: list[str]) -> set:
    return {r["event_id"] for s in topology.STAGES for pid in pipeline_ids for r in dbs.outbox_of(s, pid)}


def _inbox(dbs, service: str, pipeline_ids: list[str]) -> list:
    return [row for pid in pipeline_ids for row in dbs.inbox_of(service, pid)]


def _running(dbs, service: str, ids: list[str]) -> bool:
    return any(job["status"] == "RUNNING" for job in dbs.jobs_of(service, ids))


def _stage_goes_on_without_the_relay(running, dbs, service: str, ids: list[str]) -> None:
    """With the relay dead, a stage finishes the jobs it has; their facts wait in its outbox."""
    unfinished = [job["pipeline_id"] for job in dbs.jobs_of(service, ids) if job["status"] != "SUCCEEDED"]
    assert unfinished, f"every {service} job finished before the relay died: the outage covered nothing"
    running.wait_until(
        f"{service} finishing its jobs without a relay",
        lambda: {job["status"] for job in dbs.jobs_of(service, unfinished)} == {"SUCCEEDED"},
    )
    waiting = {
        row["pipeline_id"]
        for pid in unfinished
        for row in dbs.outbox_of(service, pid)
        if row["routing_key"] == f"{service}.completed" and row["published_at"] is None
    }
    assert set(unfinished) <= waiting
    following = topology.STAGES[topology.STAGES.index(service) + 1]
    assert dbs.jobs_of(following, unfinished) == []
    for pid in unfinished:
        stage = next(s for s in running.client.status(pid).stages if s.stage.value == service)
        assert stage.status != "SUCCEEDED"  # the gateway has not heard either


@pytest.mark.timeout(180)
def test_the_relay_killed_and_stopped_mid_run_loses_nothing(shared):
    running, dbs = shared, shared.dbs
    for service in topology.STAGES:
        running.faults(service, latency_s=0.7)
    ids = [running.submit(briefs.sample(f"가게 {n}")) for n in range(8)]

    # SIGKILL while lyrics are being written: whatever the relay had in flight is neither lost nor doubled.
    running.wait_until("a lyric attempt running", lambda: _running(dbs, "lyric", ids))
    running.services.kill("relay")
    # Requests accepted while the relay is down wait in the gateway's outbox.
    late = [running.submit(briefs.sample(f"늦은 가게 {n}")) for n in range(2)]
    _stage_goes_on_without_the_relay(running, dbs, "lyric", ids)
    assert dbs.unpublished(late).get("api", 0) >= len(late)
    for pid in late:
        assert running.client.status(pid).status == "PENDING"
        assert dbs.jobs_of("lyric", [pid]) == []
    ids += late
    running.services.start("relay")

    # SIGTERM while songs are being made, and a while without a relay again.
    running.wait_until("a song attempt running", lambda: _running(dbs, "song", ids))
    running.services.stop("relay")
    _stage_goes_on_without_the_relay(running, dbs, "song", ids)
    running.services.start("relay")

    views = running.wait_terminal(ids, timeout_s=120)

    assert {pid: view.status for pid, view in views.items()} == dict.fromkeys(ids, "SUCCEEDED")
    running.wait_until("every outbox row published", lambda: dbs.unpublished(ids) == {})
    for service in topology.STAGES:
        jobs = dbs.jobs_of(service, ids)
        assert sorted(job["pipeline_id"] for job in jobs) == sorted(ids), service
        assert {job["status"] for job in jobs} == {"SUCCEEDED"}
        rows = [r for pid in ids for r in dbs.outbox_of(service, pid)]
        completed = [r["pipeline_id"] for r in rows if r["routing_key"] == f"{service}.completed"]
        assert sorted(completed) == sorted(ids), service
        # Each stage saw each trigger once, however often the relay re-published it.
        assert sorted(r["pipeline_id"] for r in _inbox(dbs, service, ids)) == sorted(ids)
    rows = [r for pid in ids for r in dbs.outbox_of("api", pid)]
    requested = [r["pipeline_id"] for r in rows if r["routing_key"] == "pipeline.requested"]
    assert sorted(requested) == sorted(ids)
    # The gateway projected every fact every stage recorded, and each timeline ends with the video.
    running.wait_until(
        "every stage event projected",
        lambda: {r["event_id"] for r in _inbox(dbs, "api", ids)} == _stage_event_ids(dbs, ids),
    )
    for pid in ids:
        timeline = dbs.timeline_of(pid)
        assert timeline[-1]["event_type"] == "video.completed"
        assert [t["event_type"] for t in timeline].count("video.completed") == 1


@pytest.mark.timeout(120)
def test_a_stage_worker_killed_mid_call_is_recovered_after_its_lease(shared):
    running, dbs = shared, shared.dbs
    running.faults("song", latency_s=60)
    pipeline_id = running.submit(briefs.sample())

    job = running.wait_until(
        "song attempt running",
        lambda: next((j for j in dbs.jobs_of("song", [pipeline_id]) if j["status"] == "RUNNING"), None),
    )
    (lost,) = dbs.attempts_of("song", job["id"])
    assert lost["outcome"] == "running" and lost["worker"] == job["lease_owner"]
    running.services.kill("song")  # SIGKILL, 60 s before its provider call would return
    assert dbs.jobs_of("song", [pipeline_id])[0]["status"] == "RUNNING"  # nobody said anything: it died
    running.faults("song")
    running.services.start("song")

    view = running.wait_terminal([pipeline_id], timeout_s=60)[pipeline_id]

    assert view.status == "SUCCEEDED"
    stages = {s.stage.value: s for s in view.stages}
    assert (stages["lyric"].attempts, stages["song"].attempts, stages["video"].attempts) == (1, 2, 1)
    (job,) = dbs.jobs_of("song", [pipeline_id])
    assert job["status"] == "SUCCEEDED" and job["attempts"] == 2
    first, second = dbs.attempts_of("song", job["id"])
    assert (first["number"], first["outcome"], first["error_code"]) == (1, "interrupted", "lease_expired")
    assert job["counted_attempts"] == 1  # the killed worker's attempt cost nothing
    assert first["worker"] == lost["worker"]
    # Recovered only once the lease (CASTAD_SONG_LEASE_S=3) had run out, not before.
    assert first["finished_at"] - first["started_at"] >= dt.timedelta(seconds=3)
    assert (second["number"], second["outcome"], second["error_code"]) == (2, "succeeded", None)
    assert second["worker"] != first["worker"] and second["worker"].startswith("song@")
    assert second["started_at"] >= first["finished_at"]

    # The song stage told the story (the lost attempt, the retry, the success), and so did the gateway.
    expected = [("song", "started", 1), ("song", "retrying", 1), ("song", "started", 2), ("song", "completed", 2)]
    song_outbox = dbs.outbox_of("song", pipeline_id)
    assert outbox_facts(song_outbox) == expected
    assert song_outbox[1]["envelope"]["data"]["error_code"] == "lease_expired"
    events = [e for _, _, e in running.events(pipeline_id) if e["step"] == "song"]
    steps = [(e["step"], e["status"], e["attempt"]) for e in events]
    assert in_order(steps, expected) and steps[0] == expected[0] and steps[-1] == expected[-1]
    for event in events:
        if event["status"] == "retrying":
            assert event["error"]["code"] == "lease_expired"
    assert len(dbs.jobs_of("video", [pipeline_id])) == 1
