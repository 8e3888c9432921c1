"""The pipelines, their stages and attempts: every statement of the gateway on them; where the others' are.

A reader's first stop for a statement, by the tables it reads or writes:
- pipelines, stages, attempts: here (a pipeline's deadline standing still for a review too); a listing of
  pipelines: listing.py; the projection's locked read: projection_locks.py, and its writes many at once: writes.py;
- a pipeline's timeline entries: timeline_rows.py (what clients see of them: timeline.py);
- drafts and decisions: reviews.py; webhook notices and their tries: webhooks.py; webhook secrets:
  webhook_secrets.py;
- dead letters and their actions: dead_letters.py; uploaded images: uploaded.py; upload buckets: upload_limits.py;
- API keys and their creation counts: keys.py; the gateway's own keys: keyring.py; brand kits: brands.py;
- usage, budgets and tenants' weights: usage.py;
- the operator's numbers, read over all of them at once: stats.py.
retention.py and the projection run no statement of their own: each deletion or write is its aggregate's
(`forget_...` here, in timeline_rows.py, webhooks.py, dead_letters.py and uploaded.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import postgresql as pg

from castad_api import model, records, tables, timeline_rows, webhooks
from castad_api.records import columns, fields_of, typed

pipelines = tables.pipelines
stages = tables.stages
attempts = tables.attempts
TERMINAL = [status.value for status in model.PipelineStatus if status.terminal]


@dataclasses.dataclass(frozen=True)
class Created:
    pipeline_id: uuid.UUID
    request_hash: str
    new: bool


def pipeline_row(row: Any) -> records.Pipeline:
    """A pipeline's typed row from a row of SQL with its columns."""
    return typed(records.Pipeline, row, status=model.PipelineStatus(row.status))


def _stage(row: Any) -> records.Stage:
    return typed(records.Stage, row, status=model.StageStatus(row.status))


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
    return None if row is None else pipeline_row(row)


def get_pipeline(conn: sa.Connection, pipeline_id: uuid.UUID, tenant: str | None = None) -> records.Pipeline | None:
    row = conn.execute(_one(pipeline_id, tenant)).first()
    return None if row is None else pipeline_row(row)


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

    Not one whose deadline stands still while a draft waits for a person (pause_deadline)."""
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


# While a draft waits for a person (AWAITING_REVIEW) the deadline stands still; the projection runs these in its
# pipelined block.
_PAUSE_DEADLINE = "UPDATE pipelines SET deadline_paused_at = now() WHERE id = %s AND deadline_paused_at IS NULL"
# The deadline runs again, moved on by as long as it stood still.
_RESUME_DEADLINE = """
UPDATE pipelines SET deadline_at = deadline_at + (now() - deadline_paused_at), deadline_paused_at = NULL
WHERE id = %s AND deadline_paused_at IS NOT NULL
"""


def pause_deadline(conn: sa.Connection, pipeline_id: uuid.UUID) -> None:
    db.run(conn, _PAUSE_DEADLINE, (pipeline_id,))


def resume_deadline(conn: sa.Connection, pipeline_id: uuid.UUID) -> None:
    db.run(conn, _RESUME_DEADLINE, (pipeline_id,))


def now(conn: sa.Connection) -> dt.datetime:
    """The database's clock, the one retention's deletions go by."""
    return conn.execute(sa.select(sa.func.now())).scalar_one()


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


# -- Retention's (retention.py) -----------------------------------------------------------------------------------


def forget_ended(conn: sa.Connection, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` pipelines that ended more than `older_than_s` ago; how many.

    Each goes with everything that refers to it, but for those with a notice still being tried.
    """
    ended = sa.select(pipelines.c.id).where(sa.text(f"pipelines.{tables.ENDED}"), ~webhooks.being_tried(pipelines.c.id))
    doomed = list(conn.execute(db.expired(ended, pipelines.c.finished_at, older_than_s, limit)).scalars())
    if doomed:
        webhooks.forget(conn, doomed)
        timeline_rows.forget(conn, doomed)
        conn.execute(attempts.delete().where(attempts.c.pipeline_id.in_(doomed)))
        conn.execute(stages.delete().where(stages.c.pipeline_id.in_(doomed)))
        conn.execute(pipelines.delete().where(pipelines.c.id.in_(doomed)))
    return len(doomed)


def naming_images(conn: sa.Connection, image_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Those of the images a pipeline's brief names, as a photo or as its brand's logo.

    One look-up of the index pipelines_photos an image, OR-ed: a check correlated with each image is planned as a
    scan of every pipeline. The logos by the index pipelines_brand_logo.
    """
    has_photos = pipelines.c.brief.has_key(sa.literal_column(f"'{tables.PHOTOS}'"))  # a constant: the index's predicate
    each = [tables.PHOTOS_OF.op("@>")(sa.literal([{"id": str(i)}], pg.JSONB)) for i in image_ids]
    found = conn.execute(sa.select(tables.PHOTOS_OF).where(has_photos, sa.or_(*each))).scalars()
    wanted = {str(i) for i in image_ids}
    named = {uuid.UUID(photo["id"]) for photos in found for photo in photos if photo.get("id") in wanted}
    has_brand = pipelines.c.brief.has_key(sa.literal_column("'brand'"))
    logos = sa.select(tables.LOGO_OF).where(has_brand, tables.LOGO_OF.in_(wanted))
    return named | {uuid.UUID(logo) for logo in conn.execute(logos).scalars()}
