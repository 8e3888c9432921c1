"""Every SQL statement of the gateway."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from castad_contracts import events
from sqlalchemy.dialects import postgresql as pg

from castad_api import model, tables

pipelines = tables.pipelines
stages = tables.stages
timeline = tables.timeline
PIPELINE_EVENTS_CHANNEL = "castad_pipeline_events"


@dataclasses.dataclass(frozen=True)
class Created:
    pipeline_id: uuid.UUID
    request_hash: str
    new: bool


def create_pipeline(
    conn: sa.Connection, pipeline_id: uuid.UUID, key: str, request_hash: str, brief: dict[str, Any]
) -> Created:
    """Insert unless the key exists; then return what the key already points at."""
    inserted = conn.execute(
        pg.insert(pipelines)
        .values(
            id=pipeline_id,
            idempotency_key=key,
            request_hash=request_hash,
            brief=brief,
            status=model.PipelineStatus.PENDING,
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


def lock_pipeline(conn: sa.Connection, pipeline_id: uuid.UUID) -> sa.Row[Any] | None:
    return conn.execute(sa.select(pipelines).where(pipelines.c.id == pipeline_id).with_for_update()).first()


def get_pipeline(conn: sa.Connection, pipeline_id: uuid.UUID) -> sa.Row[Any] | None:
    return conn.execute(sa.select(pipelines).where(pipelines.c.id == pipeline_id)).first()


def get_stages(conn: sa.Connection, pipeline_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[sa.Row[Any]]]:
    result: dict[uuid.UUID, list[sa.Row[Any]]] = {pid: [] for pid in pipeline_ids}
    if pipeline_ids:
        for row in conn.execute(sa.select(stages).where(stages.c.pipeline_id.in_(pipeline_ids))):
            result[row.pipeline_id].append(row)
    return result


def stage_position(conn: sa.Connection, pipeline_id: uuid.UUID, stage: events.Stage) -> model.Position | None:
    row = conn.execute(
        sa.select(stages.c.rank, stages.c.attempt, stages.c.step).where(
            stages.c.pipeline_id == pipeline_id, stages.c.stage == stage.value
        )
    ).first()
    return None if row is None else (row.rank, row.attempt, row.step)


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
) -> list[sa.Row[Any]]:
    """Newest first; `after` is the (created_at, id) of the last row of the previous page."""
    query = sa.select(pipelines).order_by(pipelines.c.created_at.desc(), pipelines.c.id.desc()).limit(limit)
    if status is not None:
        query = query.where(pipelines.c.status == status.value)
    if stage is not None:
        query = query.where(pipelines.c.current_stage == stage.value)
    if after is not None:
        query = query.where(sa.tuple_(pipelines.c.created_at, pipelines.c.id) < sa.tuple_(*after))
    return list(conn.execute(query))
