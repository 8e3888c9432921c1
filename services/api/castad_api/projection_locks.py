"""The projection's hot path: a pipeline locked with what its stages applied, in one round trip, as plain SQL.

Its writes are repository.py's (save_stage, save_attempt, update_pipeline), or, many at once, writes.py's.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db

from castad_api import model, records
from castad_api.records import fields_of, typed


def _locked(row: Any) -> records.Locked:
    return typed(records.Locked, row, status=model.PipelineStatus(row.status))


def _stage_applied(row: Any) -> records.StageApplied:
    return typed(records.StageApplied, row, status=model.StageStatus(row.status))


_LOCK_PROJECTED = """
SELECT id, status, operations, cancel_requested_at, cancel_reason, error_code, error_message, callback_url,
       tenant, remade_from
FROM pipelines WHERE id = %s FOR UPDATE
"""
# Read once the pipeline is locked, by a statement of its own: a statement that waited for the lock still
# sees what it read as it was before (READ COMMITTED), so one that read the stages with the lock would miss
# what the transaction it waited for wrote.
_PROJECTED_STAGES = """
SELECT stage, status, rank, attempt, step, floor_attempt, operation, artifact, started_at FROM pipeline_stages
WHERE pipeline_id = %s
"""


@dataclasses.dataclass
class Projected:
    """A pipeline locked for its projection, with what its stages have applied so far."""

    pipeline: records.Locked
    stages: dict[events.Stage, records.StageApplied]

    def applied(self, stage: events.Stage) -> model.Applied | None:
        row = self.stages.get(stage)
        return None if row is None else row.applied

    def statuses(self) -> dict[events.Stage, model.StageStatus]:
        return {stage: row.status for stage, row in self.stages.items()}

    def artifacts(self) -> dict[str, Any]:
        return {stage.value: row.artifact for stage, row in self.stages.items() if row.artifact is not None}

    def saved(self, stage: events.Stage, pos: model.Position, values: dict[str, Any]) -> None:
        """What `save_stage` wrote (a new row has its columns' defaults), for the next event of the transaction."""
        kept = {name: value for name, value in values.items() if name in _STAGE_APPLIED}
        kept.update(status=model.StageStatus(values["status"]), rank=pos[0], attempt=pos[1], step=pos[2])
        row = self.stages.get(stage)
        self.stages[stage] = records.StageApplied(**kept) if row is None else dataclasses.replace(row, **kept)

    def updated(self, changes: dict[str, Any]) -> None:
        """What `update_pipeline` wrote to the row, for the next event of the same transaction."""
        kept = {name: value for name, value in changes.items() if name in _LOCKED}
        if "status" in kept:
            kept["status"] = model.PipelineStatus(kept["status"])
        self.pipeline = dataclasses.replace(self.pipeline, **kept)


_LOCKED = frozenset(fields_of(records.Locked))
_STAGE_APPLIED = frozenset(fields_of(records.StageApplied))


def lock_projected(conn: sa.Connection, pipeline_id: uuid.UUID) -> Projected | None:
    """The pipeline, locked, with its stages, in one round trip.

    Both statements are sent before either answer is read (`db.pipelined`).
    """
    locked = db.run(conn, _LOCK_PROJECTED, (pipeline_id,))
    stages = db.run(conn, _PROJECTED_STAGES, (pipeline_id,))
    row = locked.fetchone()
    if row is None:
        return None
    return Projected(_locked(row), {events.Stage(stage.stage): _stage_applied(stage) for stage in stages.fetchall()})


_LOCK_ALL_PROJECTED = """
SELECT id, status, operations, cancel_requested_at, cancel_reason, error_code, error_message, callback_url,
       tenant, remade_from
FROM pipelines WHERE id = ANY(%s) ORDER BY id FOR UPDATE SKIP LOCKED
"""
_ALL_PROJECTED_STAGES = """
SELECT pipeline_id, stage, status, rank, attempt, step, floor_attempt, operation, artifact, started_at
FROM pipeline_stages WHERE pipeline_id = ANY(%s)
"""


def lock_all_projected(conn: sa.Connection, pipeline_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, Projected]:
    """`lock_projected` of several pipelines, leaving out any another transaction holds.

    Two statements, sent together in `db.pipelined`, without waiting: a pipeline another transaction holds is left
    out, as is one not found.
    """
    ids = sorted(set(pipeline_ids))
    locked = db.run(conn, _LOCK_ALL_PROJECTED, (ids,), prepare=db.REPLAN)
    stages = db.run(conn, _ALL_PROJECTED_STAGES, (ids,), prepare=db.REPLAN)
    found = {row.id: Projected(_locked(row), {}) for row in locked.fetchall()}
    for stage in stages.fetchall():
        if (projected := found.get(stage.pipeline_id)) is not None:
            projected.stages[events.Stage(stage.stage)] = _stage_applied(stage)
    return found
