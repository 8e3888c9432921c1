"""The pipelines, their stages, attempts and timelines: every statement of the gateway on them.

The other aggregates keep their statements in modules of their own: dead letters in dead_letters.py, uploaded
images in uploaded.py, keys in keys.py, webhooks in webhooks.py and webhook_secrets.py, usage and budgets in
usage.py, brand kits in brands.py, reviews in reviews.py; retention.py deletes what outlived its retention of each.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import uuid
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db, wakeups
from psycopg.types.json import Jsonb

from castad_api import model, records, tables

pipelines = tables.pipelines
stages = tables.stages
attempts = tables.attempts
timeline = tables.timeline
PIPELINE_EVENTS_CHANNEL = "castad_pipeline_events"
TERMINAL = [status.value for status in model.PipelineStatus if status.terminal]


@dataclasses.dataclass(frozen=True)
class Created:
    pipeline_id: uuid.UUID
    request_hash: str
    new: bool


T = TypeVar("T")


def fields_of(cls: type[Any]) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))


def columns(table: sa.Table, cls: type[Any]) -> list[sa.Column[Any]]:
    """The columns of `table` that the typed row `cls` holds, in its order."""
    return [table.c[name] for name in fields_of(cls)]


def typed(cls: type[T], row: Any, **converted: Any) -> T:
    """A typed row from a row of SQL with a column named as each field of `cls`; `converted`: fields made typed."""
    return cls(**{name: getattr(row, name) for name in fields_of(cls)} | converted)


def _pipeline(row: Any) -> records.Pipeline:
    return typed(records.Pipeline, row, status=model.PipelineStatus(row.status))


def _stage(row: Any) -> records.Stage:
    return typed(records.Stage, row, status=model.StageStatus(row.status))


def _locked(row: Any) -> records.Locked:
    return typed(records.Locked, row, status=model.PipelineStatus(row.status))


def _stage_applied(row: Any) -> records.StageApplied:
    return typed(records.StageApplied, row, status=model.StageStatus(row.status))


_CREATE_PIPELINE = """
INSERT INTO pipelines (id, tenant, idempotency_key, request_hash, brief, callback_url, status, deadline_at, trace_id,
                       review, remake_of, remade_from)
VALUES (%(id)s, %(tenant)s, %(key)s, %(request_hash)s, %(brief)s, %(callback_url)s, %(status)s,
        now() + make_interval(secs => %(deadline_s)s), %(trace_id)s, %(review)s, %(remake_of)s, %(remade_from)s)
ON CONFLICT (idempotency_key) DO NOTHING RETURNING id
"""


def create_pipeline(
    conn: sa.Connection,
    pipeline_id: uuid.UUID,
    tenant: str,
    key: str,
    request_hash: str,
    brief: dict[str, Any],
    callback_url: str | None,
    deadline_s: float,
    trace_id: str | None = None,
    review: dict[str, Any] | None = None,
    remake: events.Remake | None = None,
) -> Created:
    """Insert unless the tenant used the key already; then return what the key points at."""
    key = tenant_key(tenant, key)
    inserted = db.run(
        conn,
        _CREATE_PIPELINE,
        {
            "id": pipeline_id,
            "tenant": tenant,
            "key": key,
            "request_hash": request_hash,
            "brief": Jsonb(brief),
            "callback_url": callback_url,
            "status": model.PipelineStatus.PENDING.value,
            "deadline_s": deadline_s,
            "trace_id": trace_id,
            "review": None if review is None else Jsonb(review),
            "remake_of": remake and uuid.UUID(remake.of),
            "remade_from": remake and remake.stage.value,
        },
    ).fetchone()
    if inserted is not None:
        return Created(inserted.id, request_hash, True)
    row = conn.execute(
        sa.select(pipelines.c.id, pipelines.c.request_hash).where(pipelines.c.idempotency_key == key)
    ).one()
    return Created(row.id, row.request_hash, False)


def keyed_pipeline(conn: sa.Connection, tenant: str, key: str) -> Created | None:
    """The pipeline the tenant's Idempotency-Key made, if it made one (never new)."""
    row = conn.execute(
        sa.select(pipelines.c.id, pipelines.c.request_hash).where(
            pipelines.c.idempotency_key == tenant_key(tenant, key)
        )
    ).first()
    return None if row is None else Created(row.id, row.request_hash, False)


def tenant_key(tenant: str, key: str) -> str:
    """An Idempotency-Key as kept: the tenant's name, length first (no two tenants' keys can meet), then it."""
    return f"{len(tenant)}:{tenant}/{key}"


PIPELINE_COLUMNS = columns(pipelines, records.Pipeline)
STAGE_COLUMNS = [
    *(stages.c[name] for name in fields_of(records.Stage) if name != "captioned"),
    stages.c.sung_lines.is_not(None).label("captioned"),  # the lines themselves are read for the captions alone
]


def _one(pipeline_id: uuid.UUID, tenant: str | None) -> sa.Select[Any]:
    """The pipeline, if it is the tenant's (None: whoever's it is)."""
    query = sa.select(*PIPELINE_COLUMNS).where(pipelines.c.id == pipeline_id)
    return query if tenant is None else query.where(pipelines.c.tenant == tenant)


def lock_pipeline(conn: sa.Connection, pipeline_id: uuid.UUID, tenant: str | None = None) -> records.Pipeline | None:
    row = conn.execute(_one(pipeline_id, tenant).with_for_update()).first()
    return None if row is None else _pipeline(row)


def get_pipeline(conn: sa.Connection, pipeline_id: uuid.UUID, tenant: str | None = None) -> records.Pipeline | None:
    row = conn.execute(_one(pipeline_id, tenant)).first()
    return None if row is None else _pipeline(row)


def remakes(conn: sa.Connection, pipeline_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[uuid.UUID]]:
    """The remakes of each pipeline (pipelines_remakes), oldest first."""
    found: dict[uuid.UUID, list[uuid.UUID]] = {pid: [] for pid in pipeline_ids}
    if pipeline_ids:
        rows = conn.execute(
            sa.select(pipelines.c.remake_of, pipelines.c.id)
            .where(pipelines.c.remake_of.in_(pipeline_ids))
            .order_by(pipelines.c.created_at)
        )
        for row in rows:
            found[row.remake_of].append(row.id)
    return found


def get_stages(conn: sa.Connection, pipeline_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[records.Stage]]:
    result: dict[uuid.UUID, list[records.Stage]] = {pid: [] for pid in pipeline_ids}
    if pipeline_ids:
        for row in conn.execute(sa.select(*STAGE_COLUMNS).where(stages.c.pipeline_id.in_(pipeline_ids))):
            result[row.pipeline_id].append(_stage(row))
    return result


def get_stage(conn: sa.Connection, pipeline_id: uuid.UUID, stage: events.Stage) -> records.Stage | None:
    row = conn.execute(
        sa.select(*STAGE_COLUMNS).where(stages.c.pipeline_id == pipeline_id, stages.c.stage == stage.value)
    ).first()
    return None if row is None else _stage(row)


def sung_lines(conn: sa.Connection, pipeline_id: uuid.UUID) -> list[events.TimedLine] | None:
    """The song's sung lines, as its stage told them; None before it was made (or if its gateway kept none)."""
    found = conn.execute(
        sa.select(stages.c.sung_lines).where(
            stages.c.pipeline_id == pipeline_id, stages.c.stage == events.Stage.SONG.value
        )
    ).scalar()
    return None if found is None else [events.TimedLine.model_validate(line) for line in found]


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
            first_started_at=None,
            finished_at=None,
        )
    )


def pipeline_attempts(conn: sa.Connection, pipeline_id: uuid.UUID) -> list[records.Attempt]:
    """Every attempt of the pipeline, by stage order and number."""
    order = sa.case({stage.value: n for n, stage in enumerate(events.STAGE_ORDER)}, value=attempts.c.stage)
    query = (
        sa.select(*columns(attempts, records.Attempt))
        .where(attempts.c.pipeline_id == pipeline_id)
        .order_by(order, attempts.c.attempt)
    )
    return [typed(records.Attempt, row) for row in conn.execute(query)]


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
    """Pipelines past their deadline that no cancel was asked for yet, locked (others skip them).

    Not one whose deadline stands still while a draft waits for a person (reviews.pause_deadline)."""
    return list(
        conn.execute(
            sa.select(pipelines.c.id)
            .where(
                pipelines.c.status.not_in(TERMINAL),
                pipelines.c.deadline_at <= sa.func.now(),
                pipelines.c.cancel_requested_at.is_(None),
                pipelines.c.deadline_paused_at.is_(None),
            )
            .order_by(pipelines.c.deadline_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).scalars()
    )


def now(conn: sa.Connection) -> dt.datetime:
    """The database's clock, the one retention's deletions go by."""
    return conn.execute(sa.select(sa.func.now())).scalar_one()


def append_timeline(
    conn: sa.Connection,
    pipeline_id: uuid.UUID,
    event_id: uuid.UUID,
    event_type: str,
    data: dict[str, Any],
    occurred_at: dt.datetime | None = None,
) -> None:
    """An entry of the pipeline's timeline.

    `occurred_at` is the event's own time (default: now). The pipeline's event streams are woken once the
    transaction committed.
    """
    db.run(conn, _APPEND_TIMELINE, (pipeline_id, event_id, event_type, Jsonb(data), occurred_at))
    wakeups.after_commit(conn, PIPELINE_EVENTS_CHANNEL, str(pipeline_id))


# When an entry happened: the event's own time, or for entries older than that column when it was written.
ENTRY_TIME = sa.func.coalesce(timeline.c.occurred_at, timeline.c.created_at).label("time")


# An entry's number among its pipeline's entries (1, 2, ...): what clients see as its `seq`. Stable: every
# entry of a pipeline is written with the pipeline's row locked (the projection, the operators' requests, the
# dead letters' notes), so they commit in the order of their seqs, and none is deleted but with all the others.
NUMBER = sa.func.row_number().over(order_by=timeline.c.seq).label("number")


def timeline_after(conn: sa.Connection, pipeline_id: uuid.UUID, after: int, limit: int = 100) -> list[records.Entry]:
    """The pipeline's entries after the one numbered `after`, each with its `number`.

    Each also has its `seq` in the whole gateway, which is not shown to clients.
    """
    query = (
        sa.select(timeline.c.seq, timeline.c.event_type, timeline.c.data, ENTRY_TIME, NUMBER)
        .where(timeline.c.pipeline_id == pipeline_id)
        .order_by(timeline.c.seq)
        .offset(after)
        .limit(limit)
    )
    return [typed(records.Entry, row) for row in conn.execute(query)]


def count_entries(conn: sa.Connection, pipeline_id: uuid.UUID) -> int:
    """How many entries the pipeline's timeline holds (the number of its newest)."""
    counted = sa.select(sa.func.count()).select_from(timeline).where(timeline.c.pipeline_id == pipeline_id)
    return int(conn.execute(counted).scalar_one())


def newest_entry(conn: sa.Connection) -> int:
    """The seq of the newest timeline entry (0: none yet)."""
    return int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(timeline.c.seq), 0))).scalar_one())


# The event listener's sweep (notifications.py), on a connection of its own: the newest seq, and which of the
# pipelines with open streams have entries after a seq (by pipeline_events_by_pipeline, one probe each).
NEWEST_ENTRY = "SELECT coalesce(max(seq), 0) FROM pipeline_events"
PIPELINES_WITH_ENTRIES_AFTER = (
    "SELECT DISTINCT pipeline_id::text FROM pipeline_events WHERE pipeline_id = ANY(%s::uuid[]) AND seq > %s"
)


def entries_of_all(
    conn: sa.Connection,
    after_seq: int,
    limit: int,
    tenant: str | None = None,
    status: model.PipelineStatus | None = None,
    stage: events.Stage | None = None,
) -> list[records.Scanned]:
    """The next `limit` timeline entries of every pipeline after `after_seq`, each with `shown`.

    Whether it is the tenant's (None: anyone's) and matches the filters (its pipeline's status after it, its step),
    and for those its pipeline's tenant and customer and the entry's number among its pipeline's entries. Every
    entry is returned, so that a gap in the seqs shows.
    """
    scanned = (
        sa.select(timeline.c.seq, timeline.c.pipeline_id, timeline.c.event_type, timeline.c.data, ENTRY_TIME)
        .where(timeline.c.seq > after_seq)
        .order_by(timeline.c.seq)
        .limit(limit)
        .subquery()
    )
    matches = [pipelines.c.id == scanned.c.pipeline_id]
    if tenant is not None:
        matches.append(pipelines.c.tenant == tenant)
    if status is not None:
        matches.append(scanned.c.data["pipeline_status"].astext == status.value)
    if stage is not None:
        matches.append(scanned.c.data["step"].astext == stage.value)
    earlier = timeline.alias("earlier")
    number = (
        sa.select(sa.func.count())
        .where(earlier.c.pipeline_id == scanned.c.pipeline_id, earlier.c.seq <= scanned.c.seq)
        .scalar_subquery()
    )
    query = (
        sa.select(
            scanned,
            pipelines.c.id.is_not(None).label("shown"),
            sa.case((pipelines.c.id.is_not(None), number)).label("number"),
            pipelines.c.tenant,
            pipelines.c.brief["customer_name"].astext.label("customer_name"),
            pipelines.c.brief["region"].astext.label("region"),
        )
        .select_from(scanned.outerjoin(pipelines, sa.and_(*matches)))
        .order_by(scanned.c.seq)
    )
    return [typed(records.Scanned, row) for row in conn.execute(query)]


@dataclasses.dataclass(frozen=True)
class Listing:
    """What a listing of pipelines shows.

    `after` is the (created_at, id) of the last row of the previous page; `search` a pipeline id, or a part of the
    customer's name (see _named).
    """

    status: model.PipelineStatus | None = None
    stage: events.Stage | None = None
    after: tuple[dt.datetime, uuid.UUID] | None = None
    tenant: str | None = None
    search: str | uuid.UUID | None = None


def list_pipelines(conn: sa.Connection, shown: Listing, limit: int) -> list[records.Pipeline]:
    """The page of pipelines `shown` selects, newest first.

    A name is looked for among the newest RECENT pipelines first (a frequent one fills the page there at once), and
    only if they hold too few, among all its matches through the trigram index pipelines_customer_name: either way
    the page is the newest matches, and no search reads more than RECENT rows or its matches.
    """
    if isinstance(shown.search, str):
        rows = [_pipeline(row) for row in conn.execute(listing(shown, limit, within=RECENT))]
        if len(rows) == limit:
            return rows
    return [_pipeline(row) for row in conn.execute(listing(shown, limit))]


RECENT = 2000


def listing(shown: Listing, limit: int, within: int | None = None) -> sa.Select[Any]:
    """A statement of list_pipelines (bench/stats.py explains them).

    With a name to search, among the newest `within` pipelines, or (None) among every match of the trigram index.
    """
    conditions = []
    if shown.tenant is not None:
        conditions.append(pipelines.c.tenant == shown.tenant)
    if isinstance(shown.search, uuid.UUID):
        conditions.append(pipelines.c.id == shown.search)
    if shown.status is not None:
        conditions.append(pipelines.c.status == shown.status.value)
    if shown.stage is not None:
        conditions.append(pipelines.c.current_stage == shown.stage.value)
    if shown.after is not None:
        conditions.append(sa.tuple_(pipelines.c.created_at, pipelines.c.id) < sa.tuple_(*shown.after))
    newest = (pipelines.c.created_at.desc(), pipelines.c.id.desc())
    search = shown.search
    if not isinstance(search, str):
        return sa.select(pipelines).where(*conditions).order_by(*newest).limit(limit)
    if within is not None:
        recent = sa.select(pipelines).where(*conditions).order_by(*newest).limit(within).subquery()
        named = _named(recent.c.brief["customer_name"].astext, search)
        return sa.select(recent).where(named).order_by(recent.c.created_at.desc(), recent.c.id.desc()).limit(limit)
    # Every match through the trigram index, materialised: left to itself, the planner may read the listing
    # index from the newest down instead, betting that matches are everywhere, and lose the bet on every row
    # of the table when a tenant has none (names go with tenants: they are their customers).
    matches = (
        sa.select(pipelines.c.id, pipelines.c.created_at)
        .where(_named(CUSTOMER_NAME, search), *conditions)
        .cte("matches")
        .prefix_with("MATERIALIZED")
    )
    page = sa.select(matches).order_by(matches.c.created_at.desc(), matches.c.id.desc()).limit(limit).subquery()
    return (
        sa.select(pipelines)
        .join(page, page.c.id == pipelines.c.id)
        .order_by(page.c.created_at.desc(), page.c.id.desc())
    )


CUSTOMER_NAME = pipelines.c.brief["customer_name"].astext  # the expression of the index pipelines_customer_name
TRIGRAM = 3


def _named(name: sa.ColumnElement[str], search: str) -> sa.ColumnElement[bool]:
    """Names that hold `search` (any case), or, shorter than a trigram, have a word that starts with it.

    A trigram index finds both (ILIKE on the indexed expression itself, never wrapped in lower()).
    """
    escaped = search.replace("/", "//").replace("%", "/%").replace("_", "/_")
    if len(search) >= TRIGRAM:
        return name.ilike(f"%{escaped}%", escape="/")
    return sa.or_(name.ilike(f"{escaped}%", escape="/"), name.ilike(f"% {escaped}%", escape="/"))


_APPEND_TIMELINE = """
INSERT INTO pipeline_events (pipeline_id, event_id, event_type, data, occurred_at)
VALUES (%s, %s, %s, %s, coalesce(%s, now()))
"""


# -- The projection's hot path, as plain SQL (castad_runtime.db.run): a few statements per event ------------

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


_CANCELED = model.AttemptOutcome.CANCELED.value
ATTEMPT_FIELDS = ("worker", "started_at", "ended_at", "outcome", "error_code", "error_message")
# An attempt's row merged with what an event says of it, from `{source}` (VALUES, or a SELECT of many rows).
SAVE_ATTEMPT_INTO = """
INSERT INTO pipeline_attempts AS a (pipeline_id, stage, attempt, worker, started_at, ended_at, outcome, error_code,
                                    error_message)
{source}
ON CONFLICT (pipeline_id, stage, attempt) DO UPDATE SET
    worker = coalesce(a.worker, EXCLUDED.worker),
    started_at = coalesce(a.started_at, EXCLUDED.started_at),
    ended_at = CASE WHEN {ends} THEN EXCLUDED.ended_at ELSE a.ended_at END,
    outcome = CASE WHEN {ends} THEN EXCLUDED.outcome ELSE a.outcome END,
    error_code = CASE WHEN {ends} THEN EXCLUDED.error_code ELSE a.error_code END,
    error_message = CASE WHEN {ends} THEN EXCLUDED.error_message ELSE a.error_message END
""".replace(
    "{ends}",
    "EXCLUDED.ended_at IS NOT NULL AND (a.ended_at IS NULL"
    f" OR (a.outcome = '{_CANCELED}' AND EXCLUDED.outcome <> '{_CANCELED}'))",
)
_SAVE_ATTEMPT = SAVE_ATTEMPT_INTO.format(
    source="VALUES ("
    + ", ".join(f"%({field})s" for field in ("pipeline_id", "stage", "attempt", *ATTEMPT_FIELDS))
    + ")"
)


def save_attempt(
    conn: sa.Connection, pipeline_id: uuid.UUID, stage: events.Stage, attempt: int, change: dict[str, Any]
) -> None:
    """Merge what an event says of an attempt (model.attempt_change) into its row, in one statement.

    A start fills only what is missing, so a late `started` never reopens a finished attempt. An end
    is taken if the attempt had none, or had a cancel's: the attempt's own end (`retrying`, `failed`,
    `completed`) may come after the cancel that found it already ended."""
    params: dict[str, Any] = {"pipeline_id": pipeline_id, "stage": stage.value, "attempt": attempt}
    params.update({field: change.get(field) for field in ATTEMPT_FIELDS})
    db.run(conn, _SAVE_ATTEMPT, params)


def upsert_stages_sql(columns: tuple[str, ...], source: str) -> str:
    """The upsert of stages' rows with these columns from `source`.

    The columns are besides their key; `source` is VALUES, or a SELECT of many rows. The first start since the
    stage was (re)opened stays.
    """
    updates = ", ".join(
        "first_started_at = coalesce(s.first_started_at, EXCLUDED.first_started_at)"
        if column == "first_started_at"
        else f"{column} = EXCLUDED.{column}"
        for column in columns
    )
    return (
        f"INSERT INTO pipeline_stages AS s (pipeline_id, stage, {', '.join(columns)}) {source}"
        f" ON CONFLICT (pipeline_id, stage) DO UPDATE SET {updates}"
    )


@functools.cache
def _save_stage_sql(columns: tuple[str, ...]) -> str:
    values = ", ".join(f"%({column})s" for column in ("pipeline_id", "stage", *columns))
    return upsert_stages_sql(columns, f"VALUES ({values})")


def stage_row(pos: model.Position, values: dict[str, Any]) -> dict[str, Any]:
    """The columns a stage's row gets from an applied event (`values`) at `pos`, as `save_stage` writes them."""
    row = {"rank": pos[0], "attempt": pos[1], "step": pos[2], **values}
    if "started_at" in values:
        row["first_started_at"] = values["started_at"]
    for column in ("artifact", "fetched_photos", "sung_lines", "poster", "formats"):  # JSONB: as psycopg's wrapper
        if row.get(column) is not None:
            row[column] = Jsonb(row[column])
    return row


def save_stage(
    conn: sa.Connection, pipeline_id: uuid.UUID, stage: events.Stage, pos: model.Position, values: dict[str, Any]
) -> None:
    row = stage_row(pos, values)
    db.run(conn, _save_stage_sql(tuple(sorted(row))), {"pipeline_id": pipeline_id, "stage": stage.value, **row})


NOW = object()  # a value of update_pipeline: the database's now()


@functools.cache
def _pipeline_update(columns: tuple[str, ...], now: frozenset[str]) -> str:
    sets = ", ".join(f"{column} = now()" if column in now else f"{column} = %({column})s" for column in columns)
    return f"UPDATE pipelines SET updated_at = now(), {sets} WHERE id = %(id)s"


def update_pipeline(conn: sa.Connection, pipeline_id: uuid.UUID, **values: Any) -> None:
    """Set these columns (a value NOW: the database's now()); SQL values (SQLAlchemy) go the slow way."""
    if any(isinstance(value, sa.ClauseElement) for value in values.values()):
        values = {column: sa.func.now() if value is NOW else value for column, value in values.items()}
        conn.execute(pipelines.update().where(pipelines.c.id == pipeline_id).values(updated_at=sa.func.now(), **values))
        return
    now = frozenset(column for column, value in values.items() if value is NOW)
    params = {column: value for column, value in values.items() if value is not NOW}
    db.run(conn, _pipeline_update(tuple(sorted(values)), now), {"id": pipeline_id, **params})
