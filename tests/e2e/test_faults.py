"""Flaky and broken providers: retryable failures are retried to success, a permanent one ends the pipeline."""

from __future__ import annotations

import base64
import hashlib
import pathlib
import urllib.parse
import uuid

import pytest
from castad_contracts import brief, envelope, topology
from castad_testkit import briefs

from tests.e2e.conftest import FAST, in_order, outbox_facts

pytestmark = pytest.mark.e2e

PIPELINES = 20


def _file(uri: str) -> pathlib.Path:
    parsed = urllib.parse.urlparse(uri)
    assert parsed.scheme == "file", uri
    return pathlib.Path(urllib.parse.unquote(parsed.path))


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(240)
def test_twenty_pipelines_with_flaky_providers_all_succeed_with_every_failure_recorded(shared):
    running, dbs = shared, shared.dbs
    for service in topology.STAGES:
        running.faults(service, failure_rate=0.3)
    genres = [style.value for style in brief.Style]
    ids = [
        running.submit(
            brief.Brief(
                customer_name=f"가게 {n}",
                region="군산",
                detail_region_info="바다가 보이는 한옥",
                language=brief.Language.KOREAN if n % 2 else brief.Language.ENGLISH,
                genre=genres[n % len(genres)],
                orientation=brief.Orientation.VERTICAL if n % 3 else brief.Orientation.HORIZONTAL,
                duration_s=3,
            )
        )
        for n in range(PIPELINES)
    ]
    assert len(set(ids)) == PIPELINES

    views = running.wait_terminal(ids, timeout_s=180)

    assert {pid: view.status for pid, view in views.items()} == dict.fromkeys(ids, "SUCCEEDED")
    failures = {service: 0 for service in topology.STAGES}
    published: dict[str, set[str]] = {pid: set() for pid in ids}
    for service in topology.STAGES:
        jobs = dbs.jobs_of(service, ids)
        # Exactly one job per pipeline in this stage's own database, and it succeeded.
        assert sorted(job["pipeline_id"] for job in jobs) == sorted(ids), service
        for job in jobs:
            assert job["status"] == "SUCCEEDED", (service, dict(job))
            assert job["lease_owner"] is None and job["finished_at"] is not None
            attempts = dbs.attempts_of(service, job["id"])
            # Every attempt is a row: 1..n, all failed (retryable, injected) but the last.
            assert job["attempts"] == len(attempts) >= 1, (service, dict(job))
            assert [a["number"] for a in attempts] == list(range(1, len(attempts) + 1))
            *failed, last = attempts
            assert last["outcome"] == "succeeded" and last["error_code"] is None
            for attempt in failed:
                assert attempt["outcome"] == "failed_retryable", dict(attempt)
                assert attempt["error_code"] == "injected_fault"
                assert attempt["finished_at"] is not None
            failures[service] += len(failed)

            # The gateway shows the same attempt count and the artifact this job made.
            stage = next(s for s in views[job["pipeline_id"]].stages if s.stage.value == service)
            assert stage.status == "SUCCEEDED"
            assert stage.attempts == job["attempts"]
            artifact = job["result"]["artifact"]
            assert stage.artifact is not None and stage.artifact.sha256 == artifact["sha256"]
            path = _file(artifact["uri"])
            assert path.is_file() and path.stat().st_size == artifact["size"]
            assert _sha256(path) == artifact["sha256"]
            published[job["pipeline_id"]].add(path.name)

        # One completed event per job in this stage's outbox, every outbox row published.
        rows = [r for pid in ids for r in dbs.outbox_of(service, pid)]
        completed = [r for r in rows if r["routing_key"] == f"{service}.completed"]
        assert sorted(r["pipeline_id"] for r in completed) == sorted(ids)
        for row in completed:  # the video's poster, a file of its stage beside it
            poster = getattr(envelope.Envelope.model_validate(row["envelope"]).payload(), "poster", None)
            if service == "video":
                assert poster is not None and _sha256(path := _file(poster.uri)) == poster.sha256
                published[row["pipeline_id"]].add(path.name)
        retrying = [r for r in rows if r["routing_key"] == f"{service}.retrying"]
        assert len(retrying) == failures[service]
    assert sum(failures.values()) > 0, failures
    running.wait_until("every outbox row published", lambda: dbs.unpublished(ids) == {})

    # Each stage's place of each pipeline shows the files its completed event names, and nothing else.
    for pid in ids:
        names = {
            p.name
            for stage in topology.STAGES
            for p in (running.installation.artifacts_dir / stage / pid).iterdir()
            if not p.name.startswith(".")
        }
        assert names == published[pid] and len(names) == len(topology.STAGES) + 1, (pid, names)  # and the poster
    # Nothing outside the stages' places and the tenants' images: what lets each stage be given its own to write.
    assert {path.name for path in running.installation.artifacts_dir.iterdir()} <= {*topology.STAGES, "images"}

    # Listing: newest first, cursor pagination covers every pipeline once.
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        params: dict[str, str | int] = {"limit": 7, "status": "SUCCEEDED"}
        if cursor:
            params["cursor"] = cursor
        page = running.http.get("/v1/pipelines", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["items"]) <= 7
        seen.extend(item["id"] for item in body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    created = [views[pid].created_at for pid in seen]
    assert created == sorted(created, reverse=True)
    for status, stage, expected in (("FAILED", None, 0), ("RUNNING", None, 0), (None, "video", PIPELINES)):
        params = {"limit": 100} | ({"status": status} if status else {}) | ({"stage": stage} if stage else {})
        assert len(running.http.get("/v1/pipelines", params=params).json()["items"]) == expected


@pytest.mark.timeout(120)
def test_a_permanent_failure_ends_the_pipeline_at_that_stage_and_nothing_later_starts(shared):
    running, dbs = shared, shared.dbs
    running.faults("song", failure_rate=1, retryable=False)
    pipeline_id = running.submit(briefs.sample())

    view = running.wait_terminal([pipeline_id])[pipeline_id]

    # The gateway's status names the stage and the error.
    assert view.status == "FAILED"
    assert view.current_stage is not None and view.current_stage.value == "song"
    assert view.error_code == "injected_fault"
    assert view.error_message == "a fault injected on purpose"  # a tenant sees its code's public message
    internal = running.admin.http.get(f"/v1/pipelines/{pipeline_id}").json()["error_message"]
    assert "permanent fault" in internal  # an operator, the stage's own
    stages = {s.stage.value: s for s in view.stages}
    assert stages["lyric"].status == "SUCCEEDED"
    assert stages["song"].status == "FAILED"
    assert stages["song"].attempts == 1  # not retried: the error is not retryable
    assert stages["song"].last_error_code == "injected_fault"
    assert stages["video"].status == "PENDING"
    assert stages["video"].attempts == 0 and stages["video"].started_at is None

    # The event stream ends FAILED, with the error and the lyrics: on the failure, or on the lyrics' end if
    # the failure overtook it on its way to the gateway (model.pipeline_status).
    events = running.events(pipeline_id)
    last_id, last_event, final = events[-1]
    assert last_event == "progress"
    assert (final["step"], final["status"]) in (("song", "failed"), ("lyric", "completed"))
    assert final["pipeline_status"] == "FAILED"
    assert final["error"] == {"code": "injected_fault", "message": view.error_message}
    assert "lyric" in final["artifacts"] and "song" not in final["artifacts"]
    assert [e[2]["pipeline_status"] for e in events].count("FAILED") == 1
    steps = [(e[2]["step"], e[2]["status"]) for e in events]
    assert steps[0] == ("pipeline", "requested")
    full = [
        ("pipeline", "requested"),
        ("lyric", "started"),
        ("lyric", "completed"),
        ("song", "started"),
        ("song", "failed"),
    ]
    # Nothing else (no video), and each stage's facts in order; song's start may come before lyric's end
    # (see in_order).
    assert all(s in full for s in steps), steps
    for step in ("pipeline", "lyric", "song"):
        assert in_order([s for s in steps if s[0] == step], [s for s in full if s[0] == step]), steps
    assert ("lyric", "completed") in steps
    assert [int(e[0]) for e in events] == sorted(int(e[0]) for e in events)
    # Resuming after the last event gives nothing more; after the first, everything else.
    assert running.events(pipeline_id, last_event_id=last_id) == []
    assert running.events(pipeline_id, last_event_id=events[0][0]) == events[1:]

    # The song database: one job, FAILED after one attempt; nothing announced it completed.
    (job,) = dbs.jobs_of("song", [pipeline_id])
    assert job["status"] == "FAILED" and job["attempts"] == 1
    assert job["last_error_code"] == "injected_fault"
    (attempt,) = dbs.attempts_of("song", job["id"])
    assert attempt["outcome"] == "failed" and attempt["error_code"] == "injected_fault"
    assert [r["routing_key"] for r in dbs.outbox_of("song", pipeline_id)] == ["song.started", "song.failed"]

    # Every event was published, and the video stage never heard of this pipeline.
    running.wait_until("every outbox row published", lambda: dbs.unpublished([pipeline_id]) == {})
    assert dbs.jobs_of("video", [pipeline_id]) == []
    assert dbs.inbox_of("video", pipeline_id) == []
    assert dbs.outbox_of("video", pipeline_id) == []

    # Listing by status and by stage finds it; an unknown or bad id is a clean 4xx.
    failed = running.http.get("/v1/pipelines", params={"status": "FAILED", "stage": "song"}).json()
    assert [item["id"] for item in failed["items"]] == [pipeline_id]
    assert running.http.get("/v1/pipelines", params={"status": "SUCCEEDED"}).json()["items"] == []
    assert running.http.get("/v1/pipelines", params={"stage": "video"}).json()["items"] == []
    unknown = running.http.get(f"/v1/pipelines/{uuid.uuid4()}/events")
    assert unknown.status_code == 404
    missing = running.http.get(f"/v1/pipelines/{pipeline_id}/artifacts/video")
    assert missing.status_code == 404 and "video" in missing.json()["detail"]
    bad_cursor = running.http.get("/v1/pipelines", params={"cursor": base64.b64encode(b"nope").decode()})
    assert bad_cursor.status_code == 422 and "cursor" in bad_cursor.text


@pytest.mark.timeout(120)
def test_retryable_failures_end_the_pipeline_once_the_attempts_run_out(shared):
    running, dbs = shared, shared.dbs
    attempts_allowed = int(FAST["CASTAD_VIDEO_MAX_ATTEMPTS"])
    running.faults("video", failure_rate=1.0)
    pipeline_id = running.submit(briefs.sample())

    view = running.wait_terminal([pipeline_id])[pipeline_id]

    assert view.status == "FAILED" and view.error_code == "injected_fault"
    video = next(s for s in view.stages if s.stage.value == "video")
    assert (video.status, video.attempts, video.max_attempts) == ("FAILED", attempts_allowed, attempts_allowed)
    (job,) = dbs.jobs_of("video", [pipeline_id])
    assert (job["status"], job["attempts"], job["max_attempts"]) == ("FAILED", attempts_allowed, attempts_allowed)
    attempts = dbs.attempts_of("video", job["id"])
    numbers = range(1, attempts_allowed + 1)
    assert [(a["number"], a["error_code"]) for a in attempts] == [(n, "injected_fault") for n in numbers]
    assert all(a["outcome"].startswith("failed") and a["finished_at"] for a in attempts)
    expected = [
        *(fact for n in numbers[:-1] for fact in (("video", "started", n), ("video", "retrying", n))),
        ("video", "started", attempts_allowed),
        ("video", "failed", attempts_allowed),
    ]
    assert outbox_facts(dbs.outbox_of("video", pipeline_id)) == expected
    events = running.events(pipeline_id)
    steps = [(e["step"], e["status"], e["attempt"]) for _, _, e in events if e["step"] == "video"]
    assert in_order(steps, expected) and steps[-1] == ("video", "failed", attempts_allowed)
    assert events[-1][2]["error"]["code"] == "injected_fault"
    assert events[-1][2]["pipeline_status"] == "FAILED"
