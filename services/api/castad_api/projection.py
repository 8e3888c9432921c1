"""Applies stage events to the gateway's read model, once each, never backwards."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import sqlalchemy as sa
from castad_contracts import envelope as envelope_
from castad_contracts import events
from castad_runtime import db, inbox

from castad_api import model, repository

log = logging.getLogger(__name__)


def apply(engine: sa.Engine, env: envelope_.Envelope, payload: events.Payload) -> None:
    with db.transaction(engine) as conn:
        if inbox.first_delivery(conn, env):
            _apply(conn, env, payload)


def _apply(conn: sa.Connection, env: envelope_.Envelope, payload: events.Payload) -> None:
    pipeline_id = uuid.UUID(payload.pipeline_id)
    if repository.lock_pipeline(conn, pipeline_id) is None:
        log.warning("event %s for a pipeline this gateway never accepted", env.type)
        return
    stage, fact = model.split_type(env.type)
    attempt = int(getattr(payload, "attempt", 0))
    pos = model.position(fact, attempt)
    current = repository.stage_position(conn, pipeline_id, stage)
    if current is not None and pos <= current:
        log.info("stale %s (attempt %d) ignored", env.type, attempt)
        return
    repository.save_stage(conn, pipeline_id, stage, pos, _stage_values(fact, payload))
    statuses = repository.stage_statuses(conn, pipeline_id)
    status = model.pipeline_status(statuses)
    percent = model.progress(statuses)
    changes: dict[str, Any] = {
        "status": status.value,
        "progress": percent,
        "current_stage": (model.current_stage(statuses) or stage).value,
    }
    if isinstance(payload, events.StageFailed):
        changes.update(error_code=payload.error_code, error_message=payload.error_message)
    if status.terminal:
        changes["finished_at"] = sa.func.now()
    repository.update_pipeline(conn, pipeline_id, **changes)
    final = repository.artifacts(conn, pipeline_id) if status.terminal else None
    data = model.sse_data(stage, fact, payload, status, percent, final)
    repository.append_timeline(conn, pipeline_id, env.id, env.type, data)
    db.notify_after_commit(conn, repository.PIPELINE_EVENTS_CHANNEL, str(pipeline_id))


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
    return values


def record_request(conn: sa.Connection, pipeline_id: uuid.UUID, env: envelope_.Envelope) -> None:
    """The first timeline entry, written with the request itself."""
    data = model.sse_data(None, "requested", None, model.PipelineStatus.PENDING, 0)
    repository.append_timeline(conn, pipeline_id, env.id, env.type, data)
