"""The gateway's projection rules: positions never move a stage backwards."""

from __future__ import annotations

import datetime as dt

import pytest
from castad_api import model
from castad_api.model import PipelineStatus, StageStatus
from castad_contracts import codes, events

LYRIC, SONG, VIDEO = events.STAGE_ORDER
NOW = dt.datetime(2026, 11, 23, tzinfo=dt.UTC)


def test_facts_of_one_attempt_are_ordered_started_retrying_then_terminal():
    assert model.position("started", 1) < model.position("retrying", 1) < model.position("completed", 1)
    assert model.position("retrying", 1) < model.position("started", 2)
    assert model.position("failed", 3) == model.position("completed", 3)


def test_a_late_started_is_stale_after_completed():
    assert model.position("started", 2) < model.position("completed", 2)
    assert model.position("retrying", 1) < model.position("completed", 2)


def test_any_terminal_fact_outranks_every_later_attempts_progress():
    assert model.position("started", 9) < model.position("completed", 1)


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        ({}, PipelineStatus.PENDING),
        ({LYRIC: StageStatus.RUNNING}, PipelineStatus.RUNNING),
        ({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.RETRY_WAIT}, PipelineStatus.RUNNING),
        ({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.FAILED}, PipelineStatus.FAILED),
        (
            {LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.SUCCEEDED, VIDEO: StageStatus.SUCCEEDED},
            PipelineStatus.SUCCEEDED,
        ),
        (
            {LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.RUNNING, VIDEO: StageStatus.SUCCEEDED},
            PipelineStatus.RUNNING,
        ),
        ({LYRIC: StageStatus.SUCCEEDED, VIDEO: StageStatus.SUCCEEDED}, PipelineStatus.RUNNING),
        # The song's failure overtook the lyrics' completion: the pipeline ends once that is in too.
        ({LYRIC: StageStatus.RUNNING, SONG: StageStatus.FAILED}, PipelineStatus.RUNNING),
        ({SONG: StageStatus.FAILED}, PipelineStatus.RUNNING),
        ({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.RUNNING, VIDEO: StageStatus.FAILED}, PipelineStatus.RUNNING),
        ({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.SUCCEEDED, VIDEO: StageStatus.FAILED}, PipelineStatus.FAILED),
        ({LYRIC: StageStatus.FAILED}, PipelineStatus.FAILED),
    ],
)
def test_the_pipeline_status_follows_its_stages(stages, expected):
    assert model.pipeline_status(stages) is expected


def test_progress_is_a_third_per_succeeded_stage():
    assert model.progress({}) == 0
    assert model.progress({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.RUNNING}) == 33
    assert model.progress({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.SUCCEEDED}) == 67
    assert model.progress(dict.fromkeys(events.STAGE_ORDER, StageStatus.SUCCEEDED)) == 100


def test_split_type_reads_stage_and_fact():
    assert model.split_type("song.retrying") == (SONG, "retrying")
    with pytest.raises(ValueError):
        model.split_type("pipeline.requested")


def test_sse_data_has_the_seed_shape_and_the_error_of_a_retry():
    retrying = events.StageRetrying(
        pipeline_id="6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f",
        stage=SONG,
        job_id="j",
        attempt=2,
        max_attempts=5,
        error_code="rate_limited",
        error_message="try later",
        next_attempt_at=NOW,
    )
    data = model.sse_data(SONG, "retrying", retrying, PipelineStatus.RUNNING, 33)
    assert data == {
        "step": "song",
        "status": "retrying",
        "progress": 33,
        "pipeline_status": "RUNNING",
        "attempt": 2,
        "error": {"code": "rate_limited", "message": "try later"},
        "next_attempt_at": NOW.isoformat(),
        "max_attempts": 5,
    }


def test_the_final_sse_data_carries_the_artifact_links():
    links = {"video": {"uri": "file:///v.mp4"}}
    data = model.sse_data(None, "succeeded", None, PipelineStatus.SUCCEEDED, 100, artifacts=links)
    assert data["step"] == "pipeline"
    assert data["artifacts"] == links
    assert "attempt" not in data


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        ({}, PipelineStatus.CANCELING),
        ({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.RUNNING}, PipelineStatus.CANCELING),
        ({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.CANCELED}, PipelineStatus.CANCELING),
        (
            {LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.CANCELED, VIDEO: StageStatus.CANCELED},
            PipelineStatus.CANCELED,
        ),
        # A failure committed before the cancel reached its stage: the pipeline failed.
        ({LYRIC: StageStatus.FAILED, SONG: StageStatus.CANCELED}, PipelineStatus.FAILED),
        # ... once the stages before it are known to have succeeded.
        ({LYRIC: StageStatus.RUNNING, SONG: StageStatus.FAILED}, PipelineStatus.CANCELING),
        # The last stage completed before its cancel came: the cancel lost the race.
        (dict.fromkeys(events.STAGE_ORDER, StageStatus.SUCCEEDED), PipelineStatus.SUCCEEDED),
    ],
)
def test_with_a_cancel_pending_the_pipeline_ends_once_every_stage_has_answered(stages, expected):
    assert model.pipeline_status(stages, cancel_pending=True) is expected


def test_a_retry_floor_makes_every_event_of_the_attempts_before_it_stale():
    failed_at_3 = model.Applied(model.position("failed", 3), floor_attempt=3)
    assert model.is_stale("started", 3, 0, failed_at_3)
    assert model.is_stale("retrying", 2, 0, failed_at_3)
    reopened = model.Applied((0, 3, 0), floor_attempt=3)  # as a retry leaves it
    assert not model.is_stale("started", 4, 0, reopened)
    assert model.is_stale("failed", 3, 0, reopened)


def test_a_canceled_answer_is_stale_only_once_a_later_cancel_was_applied():
    reopened = model.Applied((0, 3, 0), floor_attempt=3, operation=1)
    # Canceled again before the reopened job ran: same attempt number, a later request.
    assert not model.is_stale("canceled", 3, 3, reopened)
    assert model.is_stale("canceled", 3, 1, reopened)
    canceled = model.Applied(model.position("canceled", 2), operation=3)
    assert model.is_stale("retrying", 2, 0, canceled)
    assert model.is_stale("completed", 2, 0, canceled)


def test_a_retry_resumes_at_the_first_stage_that_did_not_succeed():
    assert model.resume_stage({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.FAILED}) is SONG
    assert model.resume_stage({LYRIC: StageStatus.CANCELED, SONG: StageStatus.CANCELED}) is LYRIC
    assert model.resume_stage({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.SUCCEEDED}) is VIDEO


def test_the_current_stage_is_the_first_one_heard_of_that_has_not_succeeded():
    assert model.current_stage({}) is None
    assert model.current_stage({LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.RUNNING}) is SONG
    retried = {LYRIC: StageStatus.SUCCEEDED, SONG: StageStatus.PENDING, VIDEO: StageStatus.PENDING}
    assert model.current_stage(retried) is SONG
    assert model.current_stage(dict.fromkeys(events.STAGE_ORDER, StageStatus.SUCCEEDED)) is VIDEO


PIPELINE = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"
LATER = NOW + dt.timedelta(seconds=7)


def _retrying(code: str, attempt: int = 2) -> events.StageRetrying:
    return events.StageRetrying(
        pipeline_id=PIPELINE,
        stage=SONG,
        job_id="j",
        attempt=attempt,
        max_attempts=5,
        error_code=code,
        error_message=f"{code} happened",
        next_attempt_at=LATER + dt.timedelta(seconds=30),
    )


def test_a_started_event_tells_its_attempts_worker_and_start():
    started = events.StageStarted(pipeline_id=PIPELINE, stage=SONG, job_id="j", attempt=2, started_at=NOW, worker="w")
    assert model.attempt_change("started", started, LATER) == {"worker": "w", "started_at": NOW}


@pytest.mark.parametrize("code", codes.INTERRUPTIONS)
def test_an_attempt_the_machinery_handed_back_ended_interrupted_at_its_events_time(code):
    assert model.attempt_change("retrying", _retrying(code), LATER) == {
        "ended_at": LATER,
        "outcome": "interrupted",
        "error_code": code,
        "error_message": f"{code} happened",
    }


@pytest.mark.parametrize("code", ["provider_error", "attempt_timeout", "rate_limited", "internal_error"])
def test_an_attempt_whose_work_failed_and_is_retried_ended_failed_retryable(code):
    change = model.attempt_change("retrying", _retrying(code), LATER)
    assert change is not None and (change["outcome"], change["error_code"]) == ("failed_retryable", code)


def test_the_end_of_a_failed_completed_or_canceled_attempt_is_the_time_its_payload_gives():
    artifact = events.Artifact(uri="file:///s.wav", sha256="0" * 64, size=1, media_type="audio/wav")
    failed = events.StageFailed(
        pipeline_id=PIPELINE, stage=SONG, job_id="j", attempt=3, error_code="bad", error_message="no", failed_at=NOW
    )
    canceled = events.StageCanceled(
        pipeline_id=PIPELINE, stage=SONG, job_id="j", attempt=1, operation=1, reason="stop", canceled_at=NOW
    )
    brief = {"customer_name": "머뭄", "region": "군산"}
    lyrics = {"title": "t", "language": "Korean", "sections": [{"kind": "verse", "lines": ["a"]}]}
    completed = events.SongCompleted.model_validate(
        {
            "pipeline_id": PIPELINE,
            "stage": "song",
            "job_id": "j",
            "attempt": 4,
            "artifact": artifact.model_dump(),
            "completed_at": NOW,
            "brief": brief,
            "lyrics": lyrics,
            "timed_lines": [],
            "song_duration_s": 3.0,
        }
    )
    assert model.attempt_change("failed", failed, LATER) == {
        "ended_at": NOW,
        "outcome": "failed",
        "error_code": "bad",
        "error_message": "no",
    }
    assert model.attempt_change("completed", completed, LATER) == {
        "ended_at": NOW,
        "outcome": "succeeded",
        "error_code": None,
        "error_message": None,
    }
    assert model.attempt_change("canceled", canceled, LATER) == {
        "ended_at": NOW,
        "outcome": "canceled",
        "error_code": "canceled",
        "error_message": "stop",
    }


def test_a_stage_canceled_before_it_ever_ran_has_no_attempt_to_tell_of():
    never_ran = events.StageCanceled(
        pipeline_id=PIPELINE, stage=VIDEO, job_id="j", attempt=0, operation=1, reason="stop", canceled_at=NOW
    )
    assert model.attempt_change("canceled", never_ran, LATER) is None


@pytest.mark.parametrize(
    ("traceparent", "trace_id"),
    [
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "0af7651916cd43dd8448eb211c80319c"),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", None),  # the invalid all-zero id
        ("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", None),  # upper case is not W3C's
        ("garbage", None),
        (None, None),
    ],
)
def test_a_pipelines_trace_id_is_read_from_its_requests_traceparent(traceparent, trace_id):
    assert model.trace_id(traceparent) == trace_id


def _at(attempt: int, floor_attempt: int = 0) -> model.Applied:
    return model.Applied((2, attempt, 0), floor_attempt)


def test_a_late_started_gives_its_start_only_to_a_row_of_its_attempt_that_has_none():
    assert model.fills_start("started", 1, _at(1), None)
    assert not model.fills_start("started", 1, _at(1), NOW)  # the first start stays
    assert not model.fills_start("started", 1, _at(2), None)  # the row is at a later attempt
    assert not model.fills_start("started", 2, _at(2, floor_attempt=2), None)  # before the stage was reopened
    assert not model.fills_start("completed", 1, _at(1), None)
