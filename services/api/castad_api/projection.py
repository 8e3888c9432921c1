"""Applies stage events to the gateway's read model, once each, never backwards.

Every change to a pipeline, a stage's event or an operator's request, ends in `record`:
the pipeline's status recomputed from its stages, a timeline entry (what its event
stream shows, at the event's own time) and a notification that wakes the streams.
What a stage event says of its attempt is merged into the attempt's row first, even
when the event is stale for its stage (model.attempt_change).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

import sqlalchemy as sa
from castad_contracts import envelope as envelope_
from castad_contracts import events
from castad_runtime import inbox

from castad_api import metrics, model, repository, webhooks

log = logging.getLogger(__name__)


def apply(
    engine: sa.Engine, env: envelope_.Envelope, payload: events.Payload, measured: metrics.GatewayMetrics | None = None
) -> None:
    """Project a stage event, once (its inbox row); counted in `measured` once committed. Three round trips: the
    inbox row with the pipeline's lock and stages, the writes, the commit."""
    measured = measured or metrics.GatewayMetrics()
    pipeline_id = uuid.UUID(payload.pipeline_id)
    outcome = inbox.once_read_first(
        engine,
        env,
        lambda conn: repository.lock_projected(conn, pipeline_id),
        lambda conn, projected: _apply(conn, env, payload, projected),
        measured.consumer.duplicate,
    )
    if outcome is not None:
        measured.projected.labels(env.type, outcome).inc()


def _apply(
    conn: sa.Connection, env: envelope_.Envelope, payload: events.Payload, projected: repository.Projected | None
) -> str:
    """What became of the event (metrics.APPLIED, ...), given its pipeline, locked, and its stages."""
    if projected is None:
        log.warning("event %s for a pipeline this gateway never accepted", env.type)
        return metrics.UNKNOWN_PIPELINE
    pipeline = projected.pipeline
    pipeline_id = pipeline.id
    stage, fact = model.split_type(env.type)
    attempt = int(getattr(payload, "attempt", 0))
    change = model.attempt_change(fact, payload, env.time)
    if change is not None:
        repository.save_attempt(conn, pipeline_id, stage, attempt, change)
    operation = int(getattr(payload, "operation", 0))
    superseded = fact == "canceled" and operation < pipeline.operations  # a retry came after that cancel
    if superseded or model.is_stale(fact, attempt, operation, projected.applied(stage)):
        log.info("stale %s (attempt %d) ignored", env.type, attempt)
        return metrics.STALE
    values, pos = _stage_values(fact, payload), model.position(fact, attempt)
    repository.save_stage(conn, pipeline_id, stage, pos, values)
    projected.stages.setdefault(stage, {}).update(values, rank=pos[0], attempt=pos[1], step=pos[2])
    record(conn, pipeline, env.id, env.type, stage, fact, payload, occurred_at=env.time, projected=projected)
    return metrics.APPLIED


def record(
    conn: sa.Connection,
    pipeline: Any,
    event_id: uuid.UUID,
    event_type: str,
    stage: events.Stage | None,
    fact: str,
    payload: events.Payload | None = None,
    *,
    occurred_at: dt.datetime | None = None,
    projected: repository.Projected | None = None,
    **details: Any,
) -> model.PipelineStatus:
    """After a change to `pipeline` (its row, locked) or its stages: its new status, a timeline entry (at
    `occurred_at`, the event's time; default now). `projected`: its stages as they are now, if known
    (else they are read)."""
    statuses = projected.statuses() if projected else repository.stage_statuses(conn, pipeline.id)
    status = model.pipeline_status(statuses, cancel_pending=pipeline.cancel_requested_at is not None)
    percent = model.progress(statuses)
    current = model.current_stage(statuses) or stage
    changes: dict[str, Any] = {"status": status.value, "progress": percent, "current_stage": current and current.value}
    if isinstance(payload, events.StageFailed):
        changes.update(error_code=payload.error_code, error_message=payload.error_message)
    elif status is model.PipelineStatus.FAILED:  # the failure came first (model.pipeline_status): this ends it
        details.setdefault("error", {"code": pipeline.error_code, "message": pipeline.error_message})
    if status is model.PipelineStatus.CANCELED:
        code = model.DEADLINE_EXCEEDED if pipeline.cancel_reason == model.DEADLINE_EXCEEDED else "canceled"
        changes.update(error_code=code, error_message=pipeline.cancel_reason)
    if status.terminal and not model.PipelineStatus(pipeline.status).terminal:
        changes["finished_at"] = repository.NOW
    repository.update_pipeline(conn, pipeline.id, **changes)
    final = None
    if status.terminal:
        final = projected.artifacts() if projected else repository.artifacts(conn, pipeline.id)
    if final is not None and not model.PipelineStatus(pipeline.status).terminal:
        webhooks.enqueue(conn, pipeline, status, changes.get("error_code", pipeline.error_code), final)
    data = model.sse_data(stage, fact, payload, status, percent, final, **details)
    repository.append_timeline(conn, pipeline.id, event_id, event_type, data, occurred_at)
    return status


def _stage_values(fact: str, payload: events.Payload) -> dict[str, Any]:
    values: dict[str, Any] = {"status": model.STATUS_AFTER[fact].value}
    if isinstance(payload, events.StageStarted):
        values.update(started_at=payload.started_at, next_attempt_at=None)
    elif isinstance(payload, events.StageRetrying):
        values.update(
            last_error_code=payload.error_code,
            last_error_message=payload.error_message,
            next_attempt_at=payload.next_attempt_at,
            max_attempts=payload.max_attempts,
        )
    elif isinstance(payload, events.StageFailed):
        values.update(
            last_error_code=payload.error_code,
            last_error_message=payload.error_message,
            finished_at=payload.failed_at,
            next_attempt_at=None,
        )
    elif isinstance(payload, events.StageCompleted):
        values.update(
            artifact=payload.artifact.model_dump(mode="json"), finished_at=payload.completed_at, next_attempt_at=None
        )
    elif isinstance(payload, events.StageCanceled):
        values.update(
            operation=payload.operation,
            last_error_code="canceled",
            last_error_message=payload.reason,
            finished_at=payload.canceled_at,
            next_attempt_at=None,
        )
    return values


def record_request(conn: sa.Connection, pipeline_id: uuid.UUID, env: envelope_.Envelope) -> None:
    """The first timeline entry, written with the request itself."""
    data = model.sse_data(None, "requested", None, model.PipelineStatus.PENDING, 0)
    repository.append_timeline(conn, pipeline_id, env.id, env.type, data, env.time)
