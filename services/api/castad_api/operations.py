"""An operator's levers on a pipeline: cancel, retry from the stage that did not succeed, deadlines; callbacks.

Each is a request recorded in the gateway's database with the event that announces it
(`pipeline.cancel_requested`, `pipeline.retry_requested`); the stages do the rest. The
requests of a pipeline are numbered (`operation`) so that every stage applies them in
order. Every request is an entry of the pipeline's timeline, on its event stream. A pipeline's creation is
creation.py's, a decision on its draft decisions.py's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import sqlalchemy as sa
from castad_contracts import codes, events, topology
from castad_runtime import db, outbox

from castad_api import errors, model, projection, records, repository, retention

SOURCE = topology.SOURCES[topology.GATEWAY]


@dataclasses.dataclass(frozen=True)
class Requested:
    pipeline_id: uuid.UUID
    status: model.PipelineStatus
    operation: int | None  # None: nothing new was requested (a cancel asked again)


def cancel(
    conn: sa.Connection,
    pipeline_id: uuid.UUID,
    reason: str,
    actor: str,
    tenant: str | None = None,
    key: dict[str, str] | None = None,
) -> Requested:
    """Ask every stage to stop the pipeline (of `tenant`, if given).

    Asked for `actor` with the API key `key` (keys.Principal.acting; None: the gateway itself). Asking again is
    harmless; a pipeline that ended is a Conflict.
    """
    pipeline = _locked(conn, pipeline_id, tenant)
    status = model.PipelineStatus(pipeline.status)
    if status in (model.PipelineStatus.CANCELING, model.PipelineStatus.CANCELED):
        return Requested(pipeline_id, status, None)
    if status not in model.CANCELABLE:
        raise errors.Conflict(f"pipeline {pipeline_id} has already ended {status.value}", status.value)
    operation = pipeline.operations + 1
    repository.update_pipeline(
        conn, pipeline_id, operations=operation, cancel_requested_at=sa.func.now(), cancel_reason=reason
    )
    request = events.PipelineCancelRequested(pipeline_id=str(pipeline_id), operation=operation, reason=reason)
    env = outbox.add(conn, request, events.PIPELINE_CANCEL_REQUESTED, SOURCE)
    pipeline = _locked(conn, pipeline_id)
    status = projection.record(
        conn,
        pipeline,
        env.id,
        env.type,
        None,
        "cancel_requested",
        occurred_at=env.time,
        reason=reason,
        operation=operation,
        actor=actor,
        **acting(key),
    )
    return Requested(pipeline_id, status, operation)


def retry(
    conn: sa.Connection,
    pipeline_id: uuid.UUID,
    max_attempts: dict[events.Stage, int] | None,
    policy: retention.Policy,
    actor: str,
    tenant: str | None = None,
    key: dict[str, str] | None = None,
) -> tuple[Requested, events.Stage]:
    """Resume a FAILED or CANCELED pipeline at its first stage that did not succeed.

    The pipeline is `tenant`'s, if given; asked for `actor` with the API key `key`, as `cancel`. That stage gets a
    fresh attempt budget, and the pipeline a fresh deadline. Anything else is a Conflict, and so is a pipeline that
    ended so long ago that its stages' jobs or files may be deleted before the retry ends.
    """
    pipeline = _locked(conn, pipeline_id, tenant)
    status = model.PipelineStatus(pipeline.status)
    if status not in model.RETRYABLE:
        raise errors.Conflict(
            f"pipeline {pipeline_id} is {status.value}: only a FAILED or CANCELED pipeline can be retried",
            status.value,
        )
    stages = repository.get_stages(conn, [pipeline_id])[pipeline_id]
    ended = {row.stage: row.finished_at for row in stages if row.finished_at is not None}
    refused = policy.retry_refusal(ended, repository.now(conn))
    if refused:
        raise errors.Conflict(f"pipeline {pipeline_id} can no longer be retried: {refused}", status.value)
    resume = model.resume_stage(repository.stage_statuses(conn, pipeline_id))
    operation = pipeline.operations + 1
    repository.reopen_stages(conn, pipeline_id, resume)
    repository.update_pipeline(
        conn,
        pipeline_id,
        operations=operation,
        retries=pipeline.retries + 1,
        cancel_requested_at=None,
        cancel_reason=None,
        error_code=None,
        error_message=None,
        finished_at=None,
        deadline_at=db.seconds_from_now(policy.deadline_s),
    )
    request = events.PipelineRetryRequested(
        pipeline_id=str(pipeline_id), operation=operation, stage=resume, max_attempts=max_attempts
    )
    env = outbox.add(conn, request, events.PIPELINE_RETRY_REQUESTED, SOURCE)
    pipeline = _locked(conn, pipeline_id)
    budgets = {stage.value: n for stage, n in (max_attempts or {}).items()} or None
    status = projection.record(
        conn,
        pipeline,
        env.id,
        env.type,
        None,
        "retry_requested",
        occurred_at=env.time,
        resume=resume.value,
        max_attempts=budgets,
        operation=operation,
        actor=actor,
        **acting(key),
    )
    return Requested(pipeline_id, status, operation), resume


def acting(key: dict[str, str] | None) -> dict[str, Any]:
    """The acting key as a timeline entry keeps it (disclosure.Viewer shows it as actor_key_id and _name)."""
    return {"actor_key": key} if key is not None else {}


def cancel_overdue(conn: sa.Connection, limit: int = 100) -> int:
    """Cancel the pipelines past their deadline (reason deadline_exceeded); how many."""
    overdue = repository.overdue(conn, limit)
    for pipeline_id in overdue:
        cancel(conn, pipeline_id, codes.ErrorCode.DEADLINE_EXCEEDED, actor="deadline")
    return len(overdue)


def called_back(conn: sa.Connection, pipeline_id: uuid.UUID, stage: events.Stage) -> bool:
    """A stage's provider called back.

    The stage polls it at once. Nothing is taken from the call itself (providers do not sign it), so a forged one
    can only bring a poll forward. False if the pipeline ended.
    """
    pipeline = repository.get_pipeline(conn, pipeline_id)
    if pipeline is None:
        raise errors.NotFound(f"no pipeline {pipeline_id}")
    if model.PipelineStatus(pipeline.status).terminal:
        return False
    note = events.ProviderCalledBack(pipeline_id=str(pipeline_id), stage=stage, received_at=dt.datetime.now(dt.UTC))
    outbox.add(conn, note, events.provider_called_back(stage), SOURCE)
    return True


def _locked(conn: sa.Connection, pipeline_id: uuid.UUID, tenant: str | None = None) -> records.Pipeline:
    pipeline = repository.lock_pipeline(conn, pipeline_id, tenant)
    if pipeline is None:
        raise errors.NotFound(f"no pipeline {pipeline_id}")
    return pipeline
