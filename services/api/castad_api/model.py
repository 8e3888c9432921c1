"""How the gateway reads stage events: pure rules of its projection.

Events may arrive twice or out of order. Each applied event has a position
(rank, attempt, step); an event at or before a stage's current position is stale
and changes nothing, so a late `started` never moves a stage back from `completed`.
An operator's retry sets a stage's floor to its last attempt: events of that attempt
or earlier are stale from then on. A `canceled` event answers a numbered cancel
request: it is stale once a later cancel was applied.

Attempts are facts of their own, merged in whatever order their events come (see
`attempt_change`): an event stale for its stage may still say who ran an attempt or how
it ended.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import re
from typing import Any

from castad_contracts import api, codes, events


class PipelineStatus(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    AWAITING_REVIEW = "AWAITING_REVIEW"  # a stage's draft waits for a person's decision; its deadline stands still
    CANCELING = "CANCELING"  # a cancel was requested; not every stage has answered yet
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    @property
    def terminal(self) -> bool:
        return self.value in api.ENDED


# What an operator may do to a pipeline by its status (castad_api.operations; the console offers the same).
CANCELABLE = frozenset(status for status in PipelineStatus if not status.terminal) - {PipelineStatus.CANCELING}
RETRYABLE = frozenset({PipelineStatus.FAILED, PipelineStatus.CANCELED})


class StageStatus(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RETRY_WAIT = "RETRY_WAIT"
    AWAITING_REVIEW = "AWAITING_REVIEW"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    @property
    def terminal(self) -> bool:
        return self.value in api.ENDED  # a stage ends as a pipeline does


STATUS_AFTER = {
    "started": StageStatus.RUNNING,
    "retrying": StageStatus.RETRY_WAIT,
    "completed": StageStatus.SUCCEEDED,
    "failed": StageStatus.FAILED,
    "canceled": StageStatus.CANCELED,
    "drafted": StageStatus.AWAITING_REVIEW,
}

Position = tuple[int, int, int]


def position(fact: str, attempt: int) -> Position:
    """Where an event leaves its stage: a draft after its attempt's start and retries, before its end."""
    if fact == "canceled":
        return (3, attempt, 0)
    if fact in ("completed", "failed"):
        return (2, attempt, 0)
    return (1, attempt, {"started": 0, "retrying": 1, "drafted": 2}[fact])


@dataclasses.dataclass(frozen=True)
class Applied:
    """What a stage's projection has applied so far."""

    position: Position
    floor_attempt: int = 0
    operation: int = 0


def is_stale(fact: str, attempt: int, operation: int, applied: Applied | None) -> bool:
    if applied is None:
        return False
    if fact == "canceled":
        return operation <= applied.operation
    return attempt <= applied.floor_attempt or position(fact, attempt) <= applied.position


def fills_start(fact: str, attempt: int, applied: Applied, started_at: dt.datetime | None) -> bool:
    """Whether a stale event still gives its stage's row a start time.

    A `started` of the attempt the row is at (which ended or was retried before its `started` came: the consumer's
    threads may take a stage's events out of order) when the row has no start (`started_at`). The stage does not
    move back; its start is known, as the attempt's is.
    """
    return fact == "started" and applied.position[1] == attempt > applied.floor_attempt and started_at is None


class AttemptOutcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED_RETRYABLE = "failed_retryable"  # the work failed; the stage tries again
    FAILED = "failed"  # the work failed for good (not retryable, or the last attempt)
    INTERRUPTED = "interrupted"  # the machinery lost it: handed back, not counted, tried again
    CANCELED = "canceled"  # an operator's cancel (or the deadline) stopped it
    REDRAFTED = "redrafted"  # it drafted for a review, and the review asked for a new draft


def attempt_change(fact: str, payload: events.Payload, event_time: dt.datetime) -> dict[str, Any] | None:
    """What a stage event says of its attempt (a row of pipeline_attempts), None if it names none.

    `started` gives its worker and start; `retrying`, `completed`, `failed` and `canceled` its end,
    outcome and error. The end time is the payload's where it has one, else the event's own time.
    Merged by repository.save_attempt: a start fills only what is missing (a late `started` never
    reopens a finished attempt); the first end is kept, but a cancel's gives way to the attempt's own
    end, which may come after it (the attempt had ended when the cancel came)."""
    attempt = int(getattr(payload, "attempt", 0))
    if attempt < 1:
        return None  # canceled before it ever ran
    if isinstance(payload, events.StageStarted):
        return {"worker": payload.worker, "started_at": payload.started_at}
    if isinstance(payload, events.StageRetrying):
        outcome = (
            AttemptOutcome.INTERRUPTED if payload.error_code in codes.INTERRUPTIONS else AttemptOutcome.FAILED_RETRYABLE
        )
        return _ended(event_time, outcome, payload.error_code, payload.error_message)
    if isinstance(payload, events.StageFailed):
        return _ended(payload.failed_at, AttemptOutcome.FAILED, payload.error_code, payload.error_message)
    if isinstance(payload, events.StageCompleted):
        return _ended(payload.completed_at, AttemptOutcome.SUCCEEDED, None, None)
    if isinstance(payload, events.StageCanceled):
        return _ended(payload.canceled_at, AttemptOutcome.CANCELED, codes.ErrorCode.CANCELED, payload.reason)
    return None


def _ended(at: dt.datetime, outcome: AttemptOutcome, code: str | None, message: str | None) -> dict[str, Any]:
    return {"ended_at": at, "outcome": outcome.value, "error_code": code, "error_message": message}


TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


def trace_id(traceparent: str | None) -> str | None:
    """The trace id in a W3C traceparent; None without one (or with the all-zero invalid id)."""
    found = TRACEPARENT.match(traceparent or "")
    if found is None or found.group(1) == "0" * 32:
        return None
    return found.group(1)


def split_type(event_type: str) -> tuple[events.Stage, str]:
    stage, fact = event_type.split(".", 1)
    return events.Stage(stage), fact


def pipeline_status(stage_status: dict[events.Stage, StageStatus], cancel_pending: bool = False) -> PipelineStatus:
    """The pipeline's status from its stages' statuses and a pending cancel.

    A failure is the pipeline's whatever else happens (it committed before any cancel reached its stage); a pending
    cancel ends it CANCELED once every stage has answered (ended one way or another).

    A pipeline ends only with every artifact it made known: a stage runs only once the one before it
    completed, but the gateway may project a stage's failure before that completion, and then it waits
    for it (a webhook and a stream's last entry carry the artifacts of the end)."""
    failed = next((stage for stage in events.STAGE_ORDER if stage_status.get(stage) is StageStatus.FAILED), None)
    if failed is not None and _succeeded_before(stage_status, failed):
        return PipelineStatus.FAILED
    # Every stage, not just the last: the gateway may project video.completed before a
    # retried song.completed, and a pipeline is done only with all its artifacts known.
    if all(stage_status.get(stage) is StageStatus.SUCCEEDED for stage in events.STAGE_ORDER):
        return PipelineStatus.SUCCEEDED
    if cancel_pending:
        ended = all(stage_status.get(stage, StageStatus.PENDING).terminal for stage in events.STAGE_ORDER)
        return PipelineStatus.CANCELED if ended else PipelineStatus.CANCELING
    if StageStatus.AWAITING_REVIEW in stage_status.values():
        return PipelineStatus.AWAITING_REVIEW
    if stage_status:
        return PipelineStatus.RUNNING
    return PipelineStatus.PENDING


def _succeeded_before(stage_status: dict[events.Stage, StageStatus], stage: events.Stage) -> bool:
    earlier = events.STAGE_ORDER[: events.STAGE_ORDER.index(stage)]
    return all(stage_status.get(before) is StageStatus.SUCCEEDED for before in earlier)


def resume_stage(stage_status: dict[events.Stage, StageStatus]) -> events.Stage:
    """Where a retry resumes: the first stage that did not succeed."""
    return next(stage for stage in events.STAGE_ORDER if stage_status.get(stage) is not StageStatus.SUCCEEDED)


def progress(stage_status: dict[events.Stage, StageStatus]) -> int:
    """Percent of the pipeline done: each succeeded stage is a third."""
    done = sum(1 for status in stage_status.values() if status is StageStatus.SUCCEEDED)
    return round(100 * done / len(events.STAGE_ORDER))


def current_stage(stage_status: dict[events.Stage, StageStatus]) -> events.Stage | None:
    """The first stage heard of that has not succeeded (else the last one heard of)."""
    known = [stage for stage in events.STAGE_ORDER if stage in stage_status]
    unfinished = [stage for stage in known if stage_status[stage] is not StageStatus.SUCCEEDED]
    if unfinished:
        return unfinished[0]
    return known[-1] if known else None


def sse_data(
    stage: events.Stage | None,
    fact: str,
    payload: events.Payload | None,
    status: PipelineStatus,
    percent: int,
    artifacts: dict[str, Any] | None = None,
    **details: Any,
) -> dict[str, Any]:
    """One progress message in the shape the seeds use: step, status, progress (+ details)."""
    data: dict[str, Any] = {
        "step": stage.value if stage else "pipeline",
        "status": fact,
        "progress": percent,
        "pipeline_status": status.value,
        **details,
    }
    if payload is not None:
        data["attempt"] = getattr(payload, "attempt", None)
    if isinstance(payload, events.StageStarted):
        data["worker"] = payload.worker
    if isinstance(payload, events.StageRetrying):
        data.update(
            error={"code": payload.error_code, "message": payload.error_message},
            next_attempt_at=payload.next_attempt_at.isoformat(),
            max_attempts=payload.max_attempts,
        )
    if isinstance(payload, events.StageFailed):
        data["error"] = {"code": payload.error_code, "message": payload.error_message}
    if isinstance(payload, events.StageCompleted):
        data["artifact"] = payload.artifact.model_dump(mode="json")
    if isinstance(payload, events.StageCanceled):
        data["reason"] = payload.reason
    if isinstance(payload, events.LyricDrafted):
        data["draft"] = {
            "id": payload.draft_id,
            "round": payload.round,
            "text": payload.lyrics.text(),
            "review_until": payload.review_until.isoformat(),
            "on_timeout": payload.on_timeout,
        }
    if isinstance(payload, events.StageReviewExpired):
        data["draft"] = {"id": payload.draft_id, "on_timeout": payload.on_timeout}
    if artifacts is not None:
        data["artifacts"] = artifacts
    return data
