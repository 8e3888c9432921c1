"""An operator's levers, end to end: cancel, retry from the stage that failed, deadlines, dead letters.

Every service is its own process; the tests act through the gateway's API and look at what each
service recorded in its own database.
"""

from __future__ import annotations

import datetime as dt
import time

import httpx
import pytest
from castad_contracts import topology
from castad_testkit import briefs

pytestmark = pytest.mark.e2e

HANG = {"CASTAD_LYRIC_FAULT_HANG_RATE": "1"}  # every lyric call hangs until its attempt is cancelled


def post(running, path: str, body: dict | None = None) -> httpx.Response:
    return running.http.post(path, json=body or {}, headers={"X-Castad-Actor": "e2e"})


def stage_facts(dbs, service: str, pipeline_id: str) -> list[str]:
    return [row["routing_key"].split(".", 1)[1] for row in dbs.outbox_of(service, pipeline_id)]


def timeline_types(running, pipeline_id: str) -> list[str]:
    return [event["status"] for _, _, event in running.events(pipeline_id)]


@pytest.mark.timeout(120)
def test_a_cancel_stops_a_running_call_and_a_pending_job_and_nothing_later_starts(castad, dbs):
    running = castad({**HANG, "CASTAD_LYRIC_CONCURRENCY": "1"})
    submitted = [running.submit(briefs.sample("첫 가게")), running.submit(briefs.sample("둘째 가게"))]
    # The lyric stage takes one job at a time: whichever of the two its consumer made first, not always the first.
    running.wait_until("a lyric call hanging", lambda: any(_attempts(dbs, "lyric", p) for p in submitted))
    first = next(p for p in submitted if _attempts(dbs, "lyric", p))
    second = next(p for p in submitted if p != first)
    running.wait_until("the second lyric job pending", lambda: _job(dbs, "lyric", second))
    assert _job(dbs, "lyric", second)["status"] == "PENDING"

    answers = [post(running, f"/v1/pipelines/{pid}/cancel", {"reason": "wrong brief"}) for pid in (second, first)]
    views = running.wait_terminal([first, second], timeout_s=30)

    assert [a.status_code for a in answers] == [202, 202]
    assert {a.json()["status"] for a in answers} == {"CANCELING"}
    for pipeline_id in (first, second):
        view = views[pipeline_id]
        assert (view.status, view.error_code, view.cancel_reason) == ("CANCELED", "canceled", "wrong brief")
        assert [s.status for s in view.stages] == ["CANCELED"] * 3
        for service in topology.STAGES:
            assert _job(dbs, service, pipeline_id)["status"] == "CANCELED"
        assert stage_facts(dbs, "song", pipeline_id) == stage_facts(dbs, "video", pipeline_id) == ["canceled"]
        events = timeline_types(running, pipeline_id)
        assert events[0] == "requested" and "cancel_requested" in events and events[-1] == "canceled"
    # The hanging call was stopped as soon as its cancel came, not after its 600 s attempt timeout.
    [attempt] = dbs.attempts_of("lyric", _job(dbs, "lyric", first)["id"])
    assert attempt["outcome"] == "canceled"
    assert attempt["finished_at"] - attempt["started_at"] < _seconds(20)
    assert dbs.attempts_of("lyric", _job(dbs, "lyric", second)["id"]) == []
    # Asking again is harmless.
    again = post(running, f"/v1/pipelines/{first}/cancel")
    assert (again.status_code, again.json()["status"], again.json()["operation"]) == (202, "CANCELED", None)


@pytest.mark.timeout(120)
def test_a_cancel_during_a_retry_wait_ends_it_there_and_a_cancel_after_success_is_a_409(castad, dbs):
    running = castad({"CASTAD_SONG_FAULT_SWITCH": "true", "CASTAD_SONG_BACKOFF_BASE_S": "60"})
    running.faults("song", failure_rate=1)
    waiting = running.submit(briefs.sample("기다리는 가게"))
    running.wait_until(
        "song waiting to retry", lambda: (_job(dbs, "song", waiting) or {}).get("status") == "RETRY_WAIT"
    )

    assert post(running, f"/v1/pipelines/{waiting}/cancel").status_code == 202
    view = running.wait_terminal([waiting])[waiting]

    assert view.status == "CANCELED"
    assert [s.status for s in view.stages] == ["SUCCEEDED", "CANCELED", "CANCELED"]
    assert view.stages[0].artifact is not None  # a stage that completed keeps its artifact
    assert stage_facts(dbs, "song", waiting) == ["started", "retrying", "canceled"]

    running.faults("song")
    done = running.submit(briefs.sample("끝난 가게"))
    assert running.wait_terminal([done])[done].status == "SUCCEEDED"
    late = post(running, f"/v1/pipelines/{done}/cancel")
    assert late.status_code == 409
    assert late.json()["status"] == "SUCCEEDED" and "already ended" in late.json()["detail"]


@pytest.mark.timeout(240)
def test_a_cancel_racing_the_last_stage_gives_one_outcome_each_time(shared):
    """Cancels sent as the video renders.

    Each pipeline ends SUCCEEDED or CANCELED, never both, and every service's record agrees with the outcome.
    """
    running, dbs = shared, shared.dbs
    ids = [running.submit(briefs.sample(f"경주 {n}")) for n in range(20)]
    answers = {}
    pending = set(ids)
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:
        for job in dbs.jobs_of("video", list(pending)):
            answers[job["pipeline_id"]] = post(running, f"/v1/pipelines/{job['pipeline_id']}/cancel").status_code
            pending.discard(job["pipeline_id"])
        time.sleep(0.01)
    views = running.wait_terminal(ids, timeout_s=120)

    outcomes = {pid: view.status for pid, view in views.items()}
    assert set(outcomes.values()) <= {"SUCCEEDED", "CANCELED"}
    for pipeline_id, status in outcomes.items():
        video = _job(dbs, "video", pipeline_id)
        facts = stage_facts(dbs, "video", pipeline_id)
        if status == "SUCCEEDED":
            assert video["status"] == "SUCCEEDED" and "canceled" not in facts and facts.count("completed") == 1
        else:
            assert video["status"] == "CANCELED" and "completed" not in facts and facts.count("canceled") == 1
            assert answers[pipeline_id] == 202
        if answers.get(pipeline_id) == 409:
            assert status == "SUCCEEDED"  # it had ended before the cancel reached the gateway


@pytest.mark.timeout(240)
@pytest.mark.parametrize("failing", topology.STAGES)
def test_a_retry_after_a_permanent_failure_resumes_at_that_stage_and_calls_no_earlier_provider(shared, failing):
    running, dbs = shared, shared.dbs
    running.faults(failing, failure_rate=1, retryable=False)
    pipeline_id = running.submit(briefs.sample())
    assert running.wait_terminal([pipeline_id])[pipeline_id].status == "FAILED"
    early = post(running, f"/v1/pipelines/{pipeline_id}/cancel")
    assert (early.status_code, early.json()["status"]) == (409, "FAILED")

    running.faults(failing)  # the cause is fixed
    answer = post(running, f"/v1/pipelines/{pipeline_id}/retry", {"max_attempts": {failing: 4}})
    view = running.wait_terminal([pipeline_id])[pipeline_id]

    assert answer.status_code == 202
    assert (answer.json()["resumes_at"], answer.json()["operation"]) == (failing, 1)
    assert (view.status, view.retries) == ("SUCCEEDED", 1)
    before = topology.STAGES[: topology.STAGES.index(failing)]
    for service in before:  # their providers were not called again
        assert [a["outcome"] for a in dbs.attempts_of(service, _job(dbs, service, pipeline_id)["id"])] == ["succeeded"]
    job = _job(dbs, failing, pipeline_id)
    assert [a["outcome"] for a in dbs.attempts_of(failing, job["id"])] == ["failed", "succeeded"]
    assert (job["max_attempts"], job["counted_attempts"]) == (4, 1)
    stage = next(s for s in view.stages if s.stage.value == failing)
    assert (stage.status, stage.attempts) == ("SUCCEEDED", 2)
    assert "retry_requested" in timeline_types(running, pipeline_id)
    again = post(running, f"/v1/pipelines/{pipeline_id}/retry")
    assert (again.status_code, again.json()["status"]) == (409, "SUCCEEDED")


@pytest.mark.timeout(120)
def test_a_pipeline_past_its_deadline_is_canceled_with_deadline_exceeded(castad, dbs):
    running = castad({**HANG, "CASTAD_API_PIPELINE_DEADLINE_S": "3", "CASTAD_API_DEADLINE_POLL_S": "0.5"})
    pipeline_id = running.submit(briefs.sample())

    view = running.wait_terminal([pipeline_id], timeout_s=30)[pipeline_id]

    assert (view.status, view.error_code, view.cancel_reason) == ("CANCELED", "deadline_exceeded", "deadline_exceeded")
    assert view.finished_at - view.created_at >= _seconds(3)
    [attempt] = dbs.attempts_of("lyric", _job(dbs, "lyric", pipeline_id)["id"])
    assert attempt["outcome"] == "canceled"


@pytest.mark.timeout(180)
def test_a_poison_message_is_dead_lettered_listed_replayed_after_the_fix_and_the_pipeline_completes(shared):
    running, dbs, admin = shared, shared.dbs, shared.admin  # dead letters are an operator's (the admin key's)
    running.faults("lyric", handler_rate=1)  # its handler keeps failing: dead-lettered after one retry
    pipeline_id = running.submit(briefs.sample())

    def listed():
        page = admin.http.get("/v1/dead-letters", params={"pipeline_id": pipeline_id}).json()
        return page["items"]

    [letter] = running.wait_until("the request dead-lettered and recorded", listed)
    assert (letter["kind"], letter["status"], letter["service"]) == ("message", "dead", "lyric")
    assert letter["event_type"] == "pipeline.requested" and letter["queue"].endswith(".lyric")
    assert "handler failed 2 times" in letter["reason"] and "InjectedHandlerFault" in letter["reason"]
    detail = admin.http.get(f"/v1/dead-letters/{letter['id']}").json()
    assert detail["body_encoding"] == "utf-8" and pipeline_id in detail["body"]
    assert running.client.status(pipeline_id).status == "PENDING"

    running.faults("lyric")  # the fix
    replayed = [post(admin, f"/v1/dead-letters/{letter['id']}/replay") for _ in range(2)]
    view = running.wait_terminal([pipeline_id])[pipeline_id]

    assert [r.status_code for r in replayed] == [202, 202]
    assert "sent back to" in replayed[0].json()["detail"]
    assert view.status == "SUCCEEDED"
    assert len(dbs.jobs_of("lyric", [pipeline_id])) == 1  # two replays, one effect
    detail = admin.http.get(f"/v1/dead-letters/{letter['id']}").json()
    assert (detail["status"], detail["replays"]) == ("replayed", 2)
    assert [(a["action"], a["actor"]) for a in detail["actions"]] == [("replay", "e2e"), ("replay", "e2e")]
    assert "dead_letter_replayed" in timeline_types(running, pipeline_id)
    discarded = post(admin, f"/v1/dead-letters/{letter['id']}/discard", {"reason": "done with it"})
    assert (discarded.status_code, discarded.json()["status"]) == (200, "discarded")
    refused = post(admin, f"/v1/dead-letters/{letter['id']}/replay")
    assert (refused.status_code, refused.json()["status"]) == (409, "discarded")
    assert admin.http.get("/v1/dead-letters/999999").status_code == 404


def _job(dbs, service: str, pipeline_id: str):
    jobs = dbs.jobs_of(service, [pipeline_id])
    return jobs[0] if jobs else None


def _attempts(dbs, service: str, pipeline_id: str) -> list:
    """The attempts of the pipeline's job at `service`; none while the job does not exist yet."""
    job = _job(dbs, service, pipeline_id)
    return dbs.attempts_of(service, job["id"]) if job else []


def _seconds(n: float) -> dt.timedelta:
    return dt.timedelta(seconds=n)
