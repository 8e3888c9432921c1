"""The projection's writes to the read model: made at once (`Writes`), or, for a group of events projected in one
transaction, merged per row and made by a statement a table (`Merged`).

A group's rows are merged as their statements would leave them one after the other: the last value of a
column wins, but what the statements themselves merge (an attempt's start and end, a stage's first start)
is merged alike here (`merge_attempt`, `Merged.stage`). Each table then gets one multi-row statement for
each set of columns its rows carry (a stage's `started` writes other columns than its `completed`), the
timeline one for all its entries, in order.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import postgresql as pg

from castad_api import model, repository, tables

_CANCELED = model.AttemptOutcome.CANCELED.value
_ENDS = ("ended_at", "outcome", "error_code", "error_message")


class Writes:
    """Each write made at once, in the caller's transaction."""

    def __init__(self, conn: sa.Connection) -> None:
        self.conn = conn

    def attempt(self, pipeline_id: uuid.UUID, stage: events.Stage, attempt: int, change: dict[str, Any]) -> None:
        repository.save_attempt(self.conn, pipeline_id, stage, attempt, change)

    def stage(self, pipeline_id: uuid.UUID, stage: events.Stage, pos: model.Position, values: dict[str, Any]) -> None:
        repository.save_stage(self.conn, pipeline_id, stage, pos, values)

    def pipeline(self, pipeline_id: uuid.UUID, **values: Any) -> None:
        repository.update_pipeline(self.conn, pipeline_id, **values)

    def timeline(
        self,
        pipeline_id: uuid.UUID,
        event_id: uuid.UUID,
        event_type: str,
        data: dict[str, Any],
        occurred_at: dt.datetime | None,
    ) -> None:
        repository.append_timeline(self.conn, pipeline_id, event_id, event_type, data, occurred_at)


def merge_attempt(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """Two changes of one attempt (model.attempt_change), in order, as one: what `repository.save_attempt`'s
    statement leaves of them one after the other. Who ran it and when it started: the first that says; its end:
    the later one's if the earlier had none, or had a cancel's and the later one is not."""
    merged = {
        field: earlier.get(field) if earlier.get(field) is not None else later.get(field)
        for field in ("worker", "started_at")
    }
    outcome = later.get("outcome")
    ends = later.get("ended_at") is not None and (
        earlier.get("ended_at") is None
        or (earlier.get("outcome") == _CANCELED and outcome is not None and outcome != _CANCELED)
    )
    merged.update({field: (later if ends else earlier).get(field) for field in _ENDS})
    return merged


class Merged(Writes):
    """Writes merged per row, made at `flush` (which must come before the transaction reads them back). A
    webhook's notice (`webhooks.enqueue`, at a pipeline's end) is still written at once, on `conn`."""

    def __init__(self, conn: sa.Connection) -> None:
        super().__init__(conn)
        self._attempts: dict[tuple[uuid.UUID, str, int], dict[str, Any]] = {}
        self._stages: dict[tuple[uuid.UUID, str], dict[str, Any]] = {}
        self._pipelines: dict[uuid.UUID, dict[str, Any]] = {}
        self._timeline: list[tuple[uuid.UUID, uuid.UUID, str, Jsonb, dt.datetime | None]] = []

    def attempt(self, pipeline_id: uuid.UUID, stage: events.Stage, attempt: int, change: dict[str, Any]) -> None:
        key = (pipeline_id, stage.value, attempt)
        earlier = self._attempts.get(key)
        self._attempts[key] = change if earlier is None else merge_attempt(earlier, change)

    def stage(self, pipeline_id: uuid.UUID, stage: events.Stage, pos: model.Position, values: dict[str, Any]) -> None:
        row = self._stages.setdefault((pipeline_id, stage.value), {})
        first_started_at = row.get("first_started_at")
        row.update(repository.stage_row(pos, values))
        if first_started_at is not None:  # the first start of the group stays (the statement keeps the first)
            row["first_started_at"] = first_started_at

    def pipeline(self, pipeline_id: uuid.UUID, **values: Any) -> None:
        self._pipelines.setdefault(pipeline_id, {}).update(values)

    def timeline(
        self,
        pipeline_id: uuid.UUID,
        event_id: uuid.UUID,
        event_type: str,
        data: dict[str, Any],
        occurred_at: dt.datetime | None,
    ) -> None:
        self._timeline.append((pipeline_id, event_id, event_type, Jsonb(data), occurred_at))

    def flush(self) -> None:
        """Make the merged writes: a statement a table and set of columns (sent at once in `db.pipelined`)."""
        if self._attempts:
            keys = list(self._attempts)
            params: dict[str, list[Any]] = {
                "pipeline_id": [key[0] for key in keys],
                "stage": [key[1] for key in keys],
                "attempt": [key[2] for key in keys],
            }
            params.update(
                {field: [self._attempts[key].get(field) for key in keys] for field in repository.ATTEMPT_FIELDS}
            )
            db.run(self.conn, _SAVE_ATTEMPTS, params)
        stages: defaultdict[tuple[str, ...], list[tuple[tuple[uuid.UUID, str], dict[str, Any]]]] = defaultdict(list)
        for key, row in self._stages.items():
            stages[tuple(sorted(row))].append((key, row))
        for columns, stage_rows in stages.items():
            params = {"pipeline_id": [key[0] for key, _ in stage_rows], "stage": [key[1] for key, _ in stage_rows]}
            params.update({column: [row[column] for _, row in stage_rows] for column in columns})
            db.run(self.conn, _save_stages_sql(columns), params)
        pipelines: defaultdict[tuple[tuple[str, ...], frozenset[str]], list[tuple[uuid.UUID, dict[str, Any]]]]
        pipelines = defaultdict(list)
        for pipeline_id, values in self._pipelines.items():
            now = frozenset(column for column, value in values.items() if value is repository.NOW)
            pipelines[(tuple(sorted(values)), now)].append((pipeline_id, values))
        for (columns, now), pipeline_rows in pipelines.items():
            params = {"id": [pipeline_id for pipeline_id, _ in pipeline_rows]}
            params.update({c: [values[c] for _, values in pipeline_rows] for c in columns if c not in now})
            db.run(self.conn, _update_pipelines_sql(columns, now), params)
        if self._timeline:
            db.run(self.conn, _APPEND_ALL_TIMELINE, [list(column) for column in zip(*self._timeline, strict=True)])


def _array_type(table: sa.Table, column: str) -> str:
    return f"{table.c[column].type.compile(dialect=pg.dialect())}[]"


_SAVE_ATTEMPTS = repository.SAVE_ATTEMPT_INTO.format(
    source="SELECT * FROM unnest("
    + ", ".join(
        f"%({column})s::{_array_type(tables.attempts, column)}"
        for column in ("pipeline_id", "stage", "attempt", *repository.ATTEMPT_FIELDS)
    )
    + ")"
)

_APPEND_ALL_TIMELINE = """
INSERT INTO pipeline_events (pipeline_id, event_id, event_type, data, occurred_at)
SELECT pipeline_id, event_id, event_type, data, coalesce(occurred_at, now())
FROM unnest(%s::uuid[], %s::uuid[], %s::text[], %s::jsonb[], %s::timestamptz[])
     WITH ORDINALITY AS entry (pipeline_id, event_id, event_type, data, occurred_at, position)
ORDER BY position
"""


@functools.cache
def _save_stages_sql(columns: tuple[str, ...]) -> str:
    """`repository.save_stage`'s upsert for many rows with these columns (besides their key)."""
    arrays = ", ".join(
        f"%({column})s::{_array_type(tables.stages, column)}" for column in ("pipeline_id", "stage", *columns)
    )
    return repository.upsert_stages_sql(columns, f"SELECT * FROM unnest({arrays})")


@functools.cache
def _update_pipelines_sql(columns: tuple[str, ...], now: frozenset[str]) -> str:
    """`repository.update_pipeline` for many pipelines with these columns (those in `now`: the database's now())."""
    given = [column for column in columns if column not in now]
    arrays = ", ".join(f"%({column})s::{_array_type(tables.pipelines, column)}" for column in ("id", *given))
    sets = ", ".join(f"{column} = now()" if column in now else f"{column} = u.{column}" for column in columns)
    return (
        f"UPDATE pipelines AS p SET updated_at = now(), {sets} FROM unnest({arrays}) AS u ({', '.join(('id', *given))})"
        " WHERE p.id = u.id"
    )
