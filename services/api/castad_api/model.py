"""How the gateway reads stage events: pure rules of its projection.

Events may arrive twice or out of order. Each applied event has a position
(rank, attempt, step); an event at or before a stage's current position is stale
and changes nothing, so a late `started` never moves a stage back from `completed`.
An operator's retry sets a stage's floor to its last attempt: events of that attempt
or earlier are stale from then on. A `canceled` event answers a numbered cancel
request: it is stale once a later cancel was applied.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from castad_contracts import events


class PipelineStatus(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    CANCELING = "CANCELING"  # a cancel was requested; not every stage has answered yet
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    @property
    def terminal(self) -> bool:
        return self in (PipelineStatus.SUCCEEDED, PipelineStatus.FAILED, PipelineStatus.CANCELED)


class StageStatus(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RETRY_WAIT = "RETRY_WAIT"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    @property
    def terminal(self) -> bool:
        return self in (StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.CANCELED)


STATUS_AFTER = {
    "started": StageStatus.RUNNING,
    "retrying": StageStatus.RETRY_WAIT,
    "completed": StageStatus.SUCCEEDED,
    "failed": StageStatus.FAILED,
    "canceled": StageStatus.CANCELED,
}
DEADLINE_EXCEEDED = "deadline_exceeded"  # the reason of a cancel the deadline made

Position = tuple[int, int, int]


def position(fact: str, attempt: int) -> Position:
    if fact == "canceled":
        return (3, attempt, 0)
    if fact in ("completed", "failed"):
        return (2, attempt, 0)
    return (1, attempt, 0 if fact == "started" else 1)


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


def split_type(event_type: str) -> tuple[events.Stage, str]:
    stage, fact = event_type.split(".", 1)
    return events.Stage(stage), fact


def pipeline_status(stage_status: dict[events.Stage, StageStatus], cancel_pending: bool = False) -> PipelineStatus:
    """A failure is the pipeline's whatever else happens (it committed before any cancel reached its
    stage); a pending cancel ends it CANCELED once every stage has answered (ended one way or another)."""
    if StageStatus.FAILED in stage_status.values():
        return PipelineStatus.FAILED
    # Every stage, not just the last: the gateway may project video.completed before a
    # retried song.completed, and a pipeline is done only with all its artifacts known.
    if all(stage_status.get(stage) is StageStatus.SUCCEEDED for stage in events.STAGE_ORDER):
        return PipelineStatus.SUCCEEDED
    if cancel_pending:
        ended = all(stage_status.get(stage, StageStatus.PENDING).terminal for stage in events.STAGE_ORDER)
        return PipelineStatus.CANCELED if ended else PipelineStatus.CANCELING
    if stage_status:
        return PipelineStatus.RUNNING
    return PipelineStatus.PENDING


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
    if artifacts is not None:
        data["artifacts"] = artifacts
    return data
