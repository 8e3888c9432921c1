"""Every SQL statement of the gateway."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db
from sqlalchemy.dialects import postgresql as pg

from castad_api import model, tables

pipelines = tables.pipelines
stages = tables.stages
timeline = tables.timeline
letters = tables.dead_letters
PIPELINE_EVENTS_CHANNEL = "castad_pipeline_events"
TERMINAL = [status.value for status in model.PipelineStatus if status.terminal]


@dataclasses.dataclass(frozen=True)
class Created:
    pipeline_id: uuid.UUID
    request_hash: str
    new: bool


def create_pipeline(
    conn: sa.Connection,
    pipeline_id: uuid.UUID,
    tenant: str,
    key: str,
    request_hash: str,
    brief: dict[str, Any],
    callback_url: str | None,
    deadline_s: float,
) -> Created:
    """Insert unless the tenant used the key already; then return what the key points at."""
    key = tenant_key(tenant, key)
    inserted = conn.execute(
        pg.insert(pipelines)
        .values(
            id=pipeline_id,
            tenant=tenant,
            idempotency_key=key,
            request_hash=request_hash,
            brief=brief,
            callback_url=callback_url,
            status=model.PipelineStatus.PENDING,
            deadline_at=db.seconds_from_now(deadline_s),
        )
        .on_conflict_do_nothing(index_elements=[pipelines.c.idempotency_key])
        .returning(pipelines.c.id)
    ).scalar()
    if inserted is not None:
        return Created(inserted, request_hash, True)
    row = conn.execute(
        sa.select(pipelines.c.id, pipelines.c.request_hash).where(pipelines.c.idempotency_key == key)
    ).one()
    return Created(row.id, row.request_hash, False)


def tenant_key(tenant: str, key: str) -> str:
    """An Idempotency-Key as kept: the tenant's name, length first (no two tenants' keys can meet), then it."""
    return f"{len(tenant)}:{tenant}/{key}"


def _one(pipeline_id: uuid.UUID, tenant: str | None) -> sa.Select[Any]:
    """The pipeline, if it is the tenant's (None: whoever's it is)."""
    query = sa.select(pipelines).where(pipelines.c.id == pipeline_id)
    return query if tenant is None else query.where(pipelines.c.tenant == tenant)


def lock_pipeline(conn: sa.Connection, pipeline_id: uuid.UUID, tenant: str | None = None) -> sa.Row[Any] | None:
    return conn.execute(_one(pipeline_id, tenant).with_for_update()).first()


def get_pipeline(conn: sa.Connection, pipeline_id: uuid.UUID, tenant: str | None = None) -> sa.Row[Any] | None:
    return conn.execute(_one(pipeline_id, tenant)).first()


def get_stages(conn: sa.Connection, pipeline_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[sa.Row[Any]]]:
    result: dict[uuid.UUID, list[sa.Row[Any]]] = {pid: [] for pid in pipeline_ids}
    if pipeline_ids:
        for row in conn.execute(sa.select(stages).where(stages.c.pipeline_id.in_(pipeline_ids))):
            result[row.pipeline_id].append(row)
    return result


def stage_applied(conn: sa.Connection, pipeline_id: uuid.UUID, stage: events.Stage) -> model.Applied | None:
    row = conn.execute(
        sa.select(stages.c.rank, stages.c.attempt, stages.c.step, stages.c.floor_attempt, stages.c.operation).where(
            stages.c.pipeline_id == pipeline_id, stages.c.stage == stage.value
        )
    ).first()
    if row is None:
        return None
    return model.Applied((row.rank, row.attempt, row.step), row.floor_attempt, row.operation)


def reopen_stages(conn: sa.Connection, pipeline_id: uuid.UUID, from_stage: events.Stage) -> None:
    """A retry: this stage and the later ones are PENDING again; events of their earlier attempts are stale."""
    later = [stage.value for stage in events.STAGE_ORDER[events.STAGE_ORDER.index(from_stage) :]]
    conn.execute(
        stages.update()
        .where(stages.c.pipeline_id == pipeline_id, stages.c.stage.in_(later))
        .values(
            status=model.StageStatus.PENDING.value,
            rank=0,
            step=0,
            floor_attempt=stages.c.attempt,
            next_attempt_at=None,
            started_at=None,
            finished_at=None,
        )
    )


def save_stage(
    conn: sa.Connection, pipeline_id: uuid.UUID, stage: events.Stage, pos: model.Position, values: dict[str, Any]
) -> None:
    row = {"pipeline_id": pipeline_id, "stage": stage.value, "rank": pos[0], "attempt": pos[1], "step": pos[2]}
    row.update(values)
    statement = pg.insert(stages).values(**row)
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=[stages.c.pipeline_id, stages.c.stage],
            set_={key: statement.excluded[key] for key in row if key not in ("pipeline_id", "stage")},
        )
    )


def stage_statuses(conn: sa.Connection, pipeline_id: uuid.UUID) -> dict[events.Stage, model.StageStatus]:
    rows = conn.execute(sa.select(stages.c.stage, stages.c.status).where(stages.c.pipeline_id == pipeline_id))
    return {events.Stage(row.stage): model.StageStatus(row.status) for row in rows}


def artifacts(conn: sa.Connection, pipeline_id: uuid.UUID) -> dict[str, Any]:
    rows = conn.execute(
        sa.select(stages.c.stage, stages.c.artifact).where(
            stages.c.pipeline_id == pipeline_id, stages.c.artifact.is_not(None)
        )
    )
    return {row.stage: row.artifact for row in rows}


def overdue(conn: sa.Connection, limit: int) -> list[uuid.UUID]:
    """Pipelines past their deadline that no cancel was asked for yet, locked (others skip them)."""
    return list(
        conn.execute(
            sa.select(pipelines.c.id)
            .where(
                pipelines.c.status.not_in(TERMINAL),
                pipelines.c.deadline_at <= sa.func.now(),
                pipelines.c.cancel_requested_at.is_(None),
            )
            .order_by(pipelines.c.deadline_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).scalars()
    )


def update_pipeline(conn: sa.Connection, pipeline_id: uuid.UUID, **values: Any) -> None:
    conn.execute(pipelines.update().where(pipelines.c.id == pipeline_id).values(updated_at=sa.func.now(), **values))


def append_timeline(
    conn: sa.Connection, pipeline_id: uuid.UUID, event_id: uuid.UUID, event_type: str, data: dict[str, Any]
) -> None:
    conn.execute(timeline.insert().values(pipeline_id=pipeline_id, event_id=event_id, event_type=event_type, data=data))


def timeline_after(conn: sa.Connection, pipeline_id: uuid.UUID, after_seq: int, limit: int = 100) -> list[sa.Row[Any]]:
    return list(
        conn.execute(
            sa.select(timeline.c.seq, timeline.c.event_type, timeline.c.data)
            .where(timeline.c.pipeline_id == pipeline_id, timeline.c.seq > after_seq)
            .order_by(timeline.c.seq)
            .limit(limit)
        )
    )


def list_pipelines(
    conn: sa.Connection,
    status: model.PipelineStatus | None,
    stage: events.Stage | None,
    after: tuple[dt.datetime, uuid.UUID] | None,
    limit: int,
    tenant: str | None = None,
) -> list[sa.Row[Any]]:
    """Newest first; `after` is the (created_at, id) of the last row of the previous page."""
    query = sa.select(pipelines).order_by(pipelines.c.created_at.desc(), pipelines.c.id.desc()).limit(limit)
    if tenant is not None:
        query = query.where(pipelines.c.tenant == tenant)
    if status is not None:
        query = query.where(pipelines.c.status == status.value)
    if stage is not None:
        query = query.where(pipelines.c.current_stage == stage.value)
    if after is not None:
        query = query.where(sa.tuple_(pipelines.c.created_at, pipelines.c.id) < sa.tuple_(*after))
    return list(conn.execute(query))


@dataclasses.dataclass(frozen=True)
class LetterFilters:
    status: str | None = None
    service: str | None = None
    event_type: str | None = None
    reason: str | None = None  # a part of the reason
    pipeline_id: str | None = None


def add_dead_letter(conn: sa.Connection, fields: dict[str, Any]) -> int | None:
    """Record a dead letter unless its message id is recorded already; its id, or None."""
    return conn.execute(
        pg.insert(letters)
        .values(**fields)
        .on_conflict_do_nothing(index_elements=[letters.c.message_id])
        .returning(letters.c.id)
    ).scalar()


def lock_dead_letter(conn: sa.Connection, letter_id: int) -> sa.Row[Any] | None:
    return conn.execute(sa.select(letters).where(letters.c.id == letter_id).with_for_update()).first()


def get_dead_letter(conn: sa.Connection, letter_id: int) -> sa.Row[Any] | None:
    return conn.execute(sa.select(letters).where(letters.c.id == letter_id)).first()


def dead_letters(conn: sa.Connection, filters: LetterFilters, before_id: int | None, limit: int) -> list[sa.Row[Any]]:
    """Newest first; `before_id` is the id of the last row of the previous page."""
    query = sa.select(letters).order_by(letters.c.id.desc()).limit(limit)
    for column, value in (
        (letters.c.status, filters.status),
        (letters.c.service, filters.service),
        (letters.c.event_type, filters.event_type),
        (letters.c.pipeline_id, filters.pipeline_id),
    ):
        if value is not None:
            query = query.where(column == value)
    if filters.reason:
        query = query.where(letters.c.reason.contains(filters.reason, autoescape=True))
    if before_id is not None:
        query = query.where(letters.c.id < before_id)
    return list(conn.execute(query))


def dead_letter_acted(conn: sa.Connection, letter_id: int, action: str, actor: str, detail: str, status: str) -> None:
    conn.execute(
        tables.dead_letter_actions.insert().values(dead_letter_id=letter_id, action=action, actor=actor, detail=detail)
    )
    values: dict[str, Any] = {"status": status, "updated_at": sa.func.now()}
    if action == "replay":
        values["replays"] = letters.c.replays + 1
    conn.execute(letters.update().where(letters.c.id == letter_id).values(**values))


def dead_letter_actions(conn: sa.Connection, letter_id: int) -> list[sa.Row[Any]]:
    actions = tables.dead_letter_actions
    return list(conn.execute(sa.select(actions).where(actions.c.dead_letter_id == letter_id).order_by(actions.c.id)))
