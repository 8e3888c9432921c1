"""Applies stage events to the gateway's read model, once each, never backwards.

Every change to a pipeline, a stage's event or an operator's request, ends in `record`:
the pipeline's status recomputed from its stages, a timeline entry (what its event
stream shows, at the event's own time) and a notification that wakes the streams.
What a stage event says of its attempt is merged into the attempt's row first, even
when the event is stale for its stage (model.attempt_change).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from castad_contracts import codes, events
from castad_contracts import envelope as envelope_
from castad_runtime import db, groups, inbox, logs, telemetry

from castad_api import metrics, model, projection_locks, records, repository, reviews, timeline_rows, usage, webhooks
from castad_api import writes as writes_

log = logging.getLogger(__name__)


Event = tuple[envelope_.Envelope, events.Payload]
# Transactions of grouped events under way at once: while one waits for PostgreSQL, the next is made and sent.
# With one, the projection fell behind the stages under load and finished a throughput run alone.
GROUPS_UNDER_WAY = 2
# Connections of the projection: its groups under way and the events left to their own threads. The consumer's
# threads are many more (each holds one event, so they bound a group's size); those without a connection wait.
POOL_SIZE = 4


class Projector:
    """Project the stage events its consumer's threads hand it, several in one transaction.

    Those that come together go in one transaction (`castad_runtime.groups`): under load, a commit and a few round
    trips for several events instead of each. Two such transactions may be under way, never with events of the same
    pipeline: a pipeline's events are projected in the order its threads handed them in, as with one.
    """

    def __init__(self, engine: sa.Engine, measured: metrics.GatewayMetrics | None = None, max_events: int = 32) -> None:
        self.engine = engine
        self.measured = measured or metrics.GatewayMetrics()
        self._groups = groups.GroupCommit(
            self._apply_all,
            self._apply_one,
            max_events,
            name="projection",
            max_groups=GROUPS_UNDER_WAY,
            key=_pipeline_of,
        )

    def apply(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        self._groups.submit((env, payload))

    def _apply_one(self, event: Event) -> None:
        apply(self.engine, *event, self.measured)

    def _apply_all(self, group: Sequence[Event]) -> list[None | groups.Left]:
        return apply_all(self.engine, group, self.measured)


def make_engine(database_url: str, limits: db.SessionLimits | None = None) -> sa.Engine:
    """The projection's own pool: POOL_SIZE connections, as many again while more are asked for."""
    return db.make_engine(database_url, POOL_SIZE, limits)


def _pipeline_of(event: Event) -> str:
    return event[1].pipeline_id


def apply(
    engine: sa.Engine, env: envelope_.Envelope, payload: events.Payload, measured: metrics.GatewayMetrics | None = None
) -> None:
    """Project a stage event, once (its inbox row).

    Counted in `measured` once committed. Three round trips: the inbox row with the pipeline's lock and stages, the
    writes, the commit.
    """
    measured = measured or metrics.GatewayMetrics()
    pipeline_id = uuid.UUID(payload.pipeline_id)
    outcome = inbox.once_read_first(
        engine,
        env,
        lambda conn: projection_locks.lock_projected(conn, pipeline_id),
        lambda conn, projected: _apply(writes_.Writes(conn), env, payload, projected, measured),
        measured.consumer.duplicate,
    )
    if outcome is not None:
        measured.projected.labels(env.type, outcome).inc()


def apply_all(
    engine: sa.Engine, group: Sequence[Event], measured: metrics.GatewayMetrics | None = None
) -> list[None | groups.Left]:
    """Project several stage events in one transaction, in order, each once (see `apply`).

    Three round trips in all, their writes merged per row (`writes.Merged`). The transaction waits for no lock: an
    event whose pipeline another transaction holds (or that this gateway never accepted) is left to its own thread
    (groups.ALONE), its inbox row taken back.
    """
    measured = measured or metrics.GatewayMetrics()
    results: list[None | groups.Left] = []
    with db.transaction(engine) as conn:
        with db.pipelined(conn):
            first_seen = inbox.record_all(conn, [env for env, _ in group])
            projected = projection_locks.lock_all_projected(
                conn, [uuid.UUID(payload.pipeline_id) for _, payload in group]
            )
            new = first_seen()
        merged = writes_.Merged(conn)
        with db.pipelined(conn):
            for env, payload in group:
                held = projected.get(uuid.UUID(payload.pipeline_id))
                if held is None:
                    results.append(groups.ALONE)
                    if env.id in new:
                        new.discard(env.id)
                        inbox.forget_one(conn, env.id)  # recorded by its own thread's transaction instead
                    continue
                results.append(None)
                if env.id not in new:
                    db.after_commit(conn, functools.partial(measured.consumer.duplicate, env.type))
                    continue
                new.discard(env.id)  # given twice: the second one is a duplicate
                with logs.bound(env.subject, str(env.id)), telemetry.continued(env.traceparent, env.tracestate):
                    outcome = _apply(merged, env, payload, held, measured)
                db.after_commit(conn, measured.projected.labels(env.type, outcome).inc)
            merged.flush()
    return results


def _apply(
    writes: writes_.Writes,
    env: envelope_.Envelope,
    payload: events.Payload,
    projected: projection_locks.Projected | None,
    measured: metrics.GatewayMetrics,
) -> str:
    """What became of the event (metrics.APPLIED, ...), given its pipeline, locked, and its stages."""
    if projected is None:
        log.warning("event %s for a pipeline this gateway never accepted", env.type)
        return metrics.UNKNOWN_PIPELINE
    pipeline = projected.pipeline
    pipeline_id = pipeline.id
    stage, fact = model.split_type(env.type)
    _meter(writes, env, payload, stage, pipeline, measured)
    attempt = int(getattr(payload, "attempt", 0))
    change = model.attempt_change(fact, payload, env.time)
    if change is not None:
        writes.attempt(pipeline_id, stage, attempt, change)
    if isinstance(payload, events.StageReviewExpired):  # no stage moves: the gateway settles its draft
        reviews.expired(writes.conn, payload)
    elif not _moved(writes, env, stage, fact, attempt, payload, projected):
        return metrics.STALE
    record(
        writes.conn,
        pipeline,
        env.id,
        env.type,
        stage,
        fact,
        payload,
        occurred_at=env.time,
        projected=projected,
        writes=writes,
    )
    return metrics.APPLIED


def _meter(
    writes: writes_.Writes,
    env: envelope_.Envelope,
    payload: events.Payload,
    stage: events.Stage,
    pipeline: records.Locked,
    measured: metrics.GatewayMetrics,
) -> None:
    """Count what the event says its stage used, in its tenant's usage of the event's UTC day (stale or not)."""
    reused = pipeline.remade_from is not None and events.STAGE_ORDER.index(stage) < events.STAGE_ORDER.index(
        events.Stage(pipeline.remade_from)
    )
    amounts = usage.metered(payload, stage, reused)
    if amounts:
        writes.usage(pipeline.tenant, env.time.astimezone(dt.UTC).date(), amounts)
        db.after_commit(writes.conn, functools.partial(measured.used, pipeline.tenant, amounts))


def _moved(
    writes: writes_.Writes,
    env: envelope_.Envelope,
    stage: events.Stage,
    fact: str,
    attempt: int,
    payload: events.Payload,
    projected: projection_locks.Projected,
) -> bool:
    """Move the event's stage on; False if the event is stale for it (its start may still be kept)."""
    pipeline, pipeline_id = projected.pipeline, projected.pipeline.id
    operation = int(getattr(payload, "operation", 0))
    superseded = fact == "canceled" and operation < pipeline.operations  # a retry came after that cancel
    applied = projected.applied(stage)
    if superseded or model.is_stale(fact, attempt, operation, applied):
        row = projected.stages.get(stage)
        if row is not None and model.fills_start(fact, attempt, row.applied, row.started_at):
            kept = {"status": row.status.value, "started_at": _stage_values(fact, payload)["started_at"]}
            writes.stage(pipeline_id, stage, row.applied.position, kept)
            projected.saved(stage, row.applied.position, kept)
            log.info("late %s (attempt %d): its start kept, its stage not moved back", env.type, attempt)
        else:
            log.info("stale %s (attempt %d) ignored", env.type, attempt)
        return False
    values, pos = _stage_values(fact, payload), model.position(fact, attempt)
    writes.stage(pipeline_id, stage, pos, values)
    projected.saved(stage, pos, values)
    if isinstance(payload, events.LyricDrafted):
        reviews.drafted(writes.conn, pipeline_id, payload)
        webhooks.enqueue_review(writes.conn, pipeline, payload)
    return True


def record(
    conn: sa.Connection,
    pipeline: records.Pipeline | records.Locked,
    event_id: uuid.UUID,
    event_type: str,
    stage: events.Stage | None,
    fact: str,
    payload: events.Payload | None = None,
    *,
    occurred_at: dt.datetime | None = None,
    projected: projection_locks.Projected | None = None,
    writes: writes_.Writes | None = None,
    **details: Any,
) -> model.PipelineStatus:
    """Record a change to `pipeline` or its stages: its new status and a timeline entry.

    `pipeline` is its row, locked. The entry is at `occurred_at`, the event's time (default now). `projected`: its
    stages as they are now, if known (else they are read). `writes`: how to write (default: at once, on `conn`).
    """
    writes = writes or writes_.Writes(conn)
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
        own = pipeline.cancel_reason in (codes.ErrorCode.DEADLINE_EXCEEDED, codes.ErrorCode.REVIEW_TIMEOUT)
        code = pipeline.cancel_reason if own else codes.ErrorCode.CANCELED
        changes.update(error_code=code, error_message=pipeline.cancel_reason)
    reviewing, before = model.PipelineStatus.AWAITING_REVIEW, model.PipelineStatus(pipeline.status)
    if status is reviewing and before is not reviewing:  # a draft waits for a person: the deadline stands still
        repository.pause_deadline(writes.conn, pipeline.id)
    elif before is reviewing and status is not reviewing:
        repository.resume_deadline(writes.conn, pipeline.id)
    if status.terminal and not model.PipelineStatus(pipeline.status).terminal:
        changes["finished_at"] = repository.NOW
    writes.pipeline(pipeline.id, **changes)
    if projected is not None:
        projected.updated(changes)
    final = None
    if status.terminal:
        final = projected.artifacts() if projected else repository.artifacts(conn, pipeline.id)
    if final is not None and not model.PipelineStatus(pipeline.status).terminal:
        webhooks.enqueue(conn, pipeline, status, changes.get("error_code", pipeline.error_code), final)
    data = model.sse_data(stage, fact, payload, status, percent, final, **details)
    writes.timeline(pipeline.id, event_id, event_type, data, occurred_at)
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
        if isinstance(payload, events.VideoCompleted):  # the photos it fetched are files of the stage too
            values["fetched_photos"] = [photo.model_dump(mode="json") for photo in payload.fetched_photos]
            values["poster"] = payload.poster and payload.poster.model_dump(mode="json")
            values["formats"] = [render.model_dump(mode="json") for render in payload.renders()]
        if isinstance(payload, events.SongCompleted):  # served as caption files (captions.py)
            values["sung_lines"] = [line.model_dump(mode="json") for line in payload.timed_lines]
    elif isinstance(payload, events.StageCanceled):
        values.update(
            operation=payload.operation,
            last_error_code=codes.ErrorCode.CANCELED,
            last_error_message=payload.reason,
            finished_at=payload.canceled_at,
            next_attempt_at=None,
        )
    return values


def record_request(conn: sa.Connection, pipeline_id: uuid.UUID, env: envelope_.Envelope) -> None:
    """The first timeline entry, written with the request itself."""
    data = model.sse_data(None, "requested", None, model.PipelineStatus.PENDING, 0)
    timeline_rows.append_timeline(conn, pipeline_id, env.id, env.type, data, env.time)
