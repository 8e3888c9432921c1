"""The projection's writes to the read model.

Made at once (`Writes`), or, for a group of events projected in one transaction, merged per row and made by a
statement a table (`Merged`).

A group's rows are merged as their statements would leave them one after the other: the last value of a
column wins, but what the statements themselves merge (an attempt's start and end, a stage's first start)
is merged alike here (`merge_attempt`, `Merged.stage`). Each table then gets one multi-row statement for
each set of columns its rows carry (a stage's `started` writes other columns than its `completed`), the
timeline one for all its entries, in order.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import uuid
from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from castad_contracts import api, events
from castad_runtime import db, wakeups
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import postgresql as pg

from castad_api import model, repository, tables, timeline_rows
from castad_api import usage as usage_

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
        timeline_rows.append_timeline(self.conn, pipeline_id, event_id, event_type, data, occurred_at)

    def usage(self, tenant: str, day: dt.date, amounts: dict[api.Meter, float]) -> None:
        usage_.add(self.conn, [(tenant, day, meter, amount) for meter, amount in amounts.items()])


def merge_attempt(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """Two changes of one attempt (model.attempt_change), in order, as one.

    What `repository.save_attempt`'s statement leaves of them one after the other. Who ran it and when it started:
    the first that says; its end: the later one's if the earlier had none, or had a cancel's and the later one is
    not.
    """
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
    """Writes merged per row, made at `flush` (which must come before the transaction reads them back).

    A webhook's notice (`webhooks.enqueue`, at a pipeline's end) is still written at once, on `conn`.
    """

    def __init__(self, conn: sa.Connection) -> None:
        super().__init__(conn)
        self._attempts: dict[tuple[uuid.UUID, str, int], dict[str, Any]] = {}
        self._stages: dict[tuple[uuid.UUID, str], dict[str, Any]] = {}
        self._pipelines: dict[uuid.UUID, dict[str, Any]] = {}
        self._timeline: list[dict[str, Any]] = []
        self._used: defaultdict[tuple[str, dt.date, api.Meter], float] = defaultdict(float)  # usage_.add orders them

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
        self._timeline.append(
            {
                "pipeline_id": pipeline_id,
                "event_id": event_id,
                "event_type": event_type,
                "data": data,
                "occurred_at": occurred_at,
            }
        )

    def usage(self, tenant: str, day: dt.date, amounts: dict[api.Meter, float]) -> None:
        for meter, amount in amounts.items():
            self._used[(tenant, day, meter)] += amount

    def flush(self) -> None:
        """Make the merged writes: a statement a table and set of columns (sent at once in `db.pipelined`)."""
        if self._used:
            usage_.add(self.conn, [(*key, amount) for key, amount in self._used.items()])
        if self._attempts:
            attempts = [
                {"pipeline_id": pipeline_id, "stage": stage, "attempt": attempt, **change}
                for (pipeline_id, stage, attempt), change in self._attempts.items()
            ]
            db.run(self.conn, _SAVE_ATTEMPTS, [_records(attempts)])
        stages: defaultdict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
        for (pipeline_id, stage), row in self._stages.items():
            stages[tuple(sorted(row))].append({"pipeline_id": pipeline_id, "stage": stage, **row})
        for columns, stage_rows in stages.items():
            db.run(self.conn, _save_stages_sql(columns), [_records(stage_rows)])
        pipelines: defaultdict[tuple[tuple[str, ...], frozenset[str]], list[dict[str, Any]]] = defaultdict(list)
        for pipeline_id, values in self._pipelines.items():
            now = frozenset(column for column, value in values.items() if value is repository.NOW)
            given = {column: value for column, value in values.items() if column not in now}
            pipelines[(tuple(sorted(values)), now)].append({"id": pipeline_id, **given})
        for (columns, now), pipeline_rows in pipelines.items():
            ids = [row["id"] for row in pipeline_rows]
            db.run(self.conn, _update_pipelines_sql(columns, now), [_records(pipeline_rows), ids], prepare=db.REPLAN)
        if self._timeline:
            db.run(self.conn, _APPEND_ALL_TIMELINE, [_records(self._timeline)])
            for pipeline_id in dict.fromkeys(entry["pipeline_id"] for entry in self._timeline):
                wakeups.after_commit(self.conn, timeline_rows.PIPELINE_EVENTS_CHANNEL, str(pipeline_id))


def _json_value(value: Any) -> Any:
    """What JSON has no type of, as `jsonb_to_recordset` reads it back into the column's type."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, Jsonb):  # a JSONB column's value
        return value.obj
    raise TypeError(f"{type(value).__name__} is not a value of a read model's column")


_dumps = functools.partial(json.dumps, default=_json_value, separators=(",", ":"), ensure_ascii=False)


def _records(rows: list[dict[str, Any]]) -> Jsonb:
    """Rows as one JSON array of objects, read back by `jsonb_to_recordset` (a key a row lacks: NULL).

    Psycopg dumps it with one call of the JSON encoder; a column of arrays instead goes value by value through
    Python.
    """
    return Jsonb(rows, dumps=_dumps)


_DIALECT = pg.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy's dialects are untyped


def _typed(table: sa.Table, columns: tuple[str, ...]) -> str:
    """A column definition list of these columns of `table`, typed as the table types them."""
    return ", ".join(f"{column} {table.c[column].type.compile(dialect=_DIALECT)}" for column in columns)


def _recordset(table: sa.Table, columns: tuple[str, ...]) -> str:
    """The rows of `_records` as rows of these columns of `table`."""
    return f"jsonb_to_recordset(%s::jsonb) AS u ({_typed(table, columns)})"


_ATTEMPT_COLUMNS = ("pipeline_id", "stage", "attempt", *repository.ATTEMPT_FIELDS)
_SAVE_ATTEMPTS = repository.SAVE_ATTEMPT_INTO.format(
    source=f"SELECT * FROM {_recordset(tables.attempts, _ATTEMPT_COLUMNS)}"
)

_TIMELINE_COLUMNS = ("pipeline_id", "event_id", "event_type", "data", "occurred_at")
_APPEND_ALL_TIMELINE = f"""
INSERT INTO pipeline_events ({", ".join(_TIMELINE_COLUMNS)})
SELECT pipeline_id, event_id, event_type, data, coalesce(occurred_at, now())
FROM ROWS FROM (jsonb_to_recordset(%s::jsonb) AS ({_typed(tables.timeline, _TIMELINE_COLUMNS)}))
     WITH ORDINALITY AS entry ({", ".join(_TIMELINE_COLUMNS)}, position)
ORDER BY position
"""


@functools.cache
def _save_stages_sql(columns: tuple[str, ...]) -> str:
    """`repository.save_stage`'s upsert for many rows with these columns (besides their key)."""
    rows = _recordset(tables.stages, ("pipeline_id", "stage", *columns))
    return repository.upsert_stages_sql(columns, f"SELECT * FROM {rows}")


@functools.cache
def _update_pipelines_sql(columns: tuple[str, ...], now: frozenset[str]) -> str:
    """`repository.update_pipeline` for many pipelines with these columns, in one statement.

    Those in `now` are set to the database's now(). The pipelines' ids come twice, in their rows and as an array:
    the planner cannot tell how many rows the JSON holds (it guesses 100) and would scan the whole table to join
    them; the array it counts, and looks each id up in the primary key.
    """
    given = tuple(column for column in columns if column not in now)
    sets = ", ".join(f"{column} = now()" if column in now else f"{column} = u.{column}" for column in columns)
    return (
        f"UPDATE pipelines AS p SET updated_at = now(), {sets} FROM {_recordset(tables.pipelines, ('id', *given))}"
        " WHERE p.id = u.id AND p.id = ANY(%s::uuid[])"
    )
