"""How the gateway reads stage events: pure rules of its projection.

Events may arrive twice or out of order. Each applied event has a position
(rank, attempt, step); an event at or before a stage's current position is stale
and changes nothing, so a late `started` never moves a stage back from `completed`.
"""

from __future__ import annotations

import enum
from typing import Any

from castad_contracts import events


class PipelineStatus(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (PipelineStatus.SUCCEEDED, PipelineStatus.FAILED)


class StageStatus(enum.StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RETRY_WAIT = "RETRY_WAIT"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


STATUS_AFTER = {
    "started": StageStatus.RUNNING,
    "retrying": StageStatus.RETRY_WAIT,
    "completed": StageStatus.SUCCEEDED,
    "failed": StageStatus.FAILED,
}

Position = tuple[int, int, int]


def position(fact: str, attempt: int) -> Position:
    if fact in ("completed", "failed"):
        return (2, attempt, 0)
    return (1, attempt, 0 if fact == "started" else 1)


def split_type(event_type: str) -> tuple[events.Stage, str]:
    stage, fact = event_type.split(".", 1)
    return events.Stage(stage), fact


def pipeline_status(stage_status: dict[events.Stage, StageStatus]) -> PipelineStatus:
    if StageStatus.FAILED in stage_status.values():
        return PipelineStatus.FAILED
    # Every stage, not just the last: the gateway may project video.completed before a
    # retried song.completed, and a pipeline is done only with all its artifacts known.
    if all(stage_status.get(stage) is StageStatus.SUCCEEDED for stage in events.STAGE_ORDER):
        return PipelineStatus.SUCCEEDED
    if stage_status:
        return PipelineStatus.RUNNING
    return PipelineStatus.PENDING


def progress(stage_status: dict[events.Stage, StageStatus]) -> int:
    """Percent of the pipeline done: each succeeded stage is a third."""
    done = sum(1 for status in stage_status.values() if status is StageStatus.SUCCEEDED)
    return round(100 * done / len(events.STAGE_ORDER))


def current_stage(stage_status: dict[events.Stage, StageStatus]) -> events.Stage | None:
    started = [stage for stage in events.STAGE_ORDER if stage in stage_status]
    return started[-1] if started else None


def sse_data(
    stage: events.Stage | None,
    fact: str,
    payload: events.Payload | None,
    status: PipelineStatus,
    percent: int,
    artifacts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One progress message in the shape the seeds use: step, status, progress (+ details)."""
    data: dict[str, Any] = {
        "step": stage.value if stage else "pipeline",
        "status": fact,
        "progress": percent,
        "pipeline_status": status.value,
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
    if artifacts is not None:
        data["artifacts"] = artifacts
    return data
