"""A pipeline's timeline entries as rows: every statement of the gateway on them (pipeline_events).

What clients see of them is timeline.py's; the event listener's sweep (notifications.py) runs NEWEST_ENTRY and
PIPELINES_WITH_ENTRIES_AFTER on a connection of its own.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db, wakeups
from psycopg.types.json import Jsonb

from castad_api import model, records, tables
from castad_api.records import typed

pipelines = tables.pipelines
timeline = tables.timeline
PIPELINE_EVENTS_CHANNEL = "castad_pipeline_events"


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


_APPEND_TIMELINE = """
INSERT INTO pipeline_events (pipeline_id, event_id, event_type, data, occurred_at)
VALUES (%s, %s, %s, %s, coalesce(%s, now()))
"""


def forget_ended(conn: sa.Connection, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` timeline entries of pipelines that ended more than `older_than_s` ago; how many."""
    ended = (
        sa.select(timeline.c.seq)
        .join(pipelines, pipelines.c.id == timeline.c.pipeline_id)
        .where(sa.text(f"pipelines.{tables.ENDED}"), pipelines.c.finished_at < db.seconds_from_now(-older_than_s))
    )
    doomed = db.expired(ended, timeline.c.created_at, older_than_s, limit)
    return conn.execute(timeline.delete().where(timeline.c.seq.in_(doomed.scalar_subquery()))).rowcount


def forget(conn: sa.Connection, pipeline_ids: Sequence[uuid.UUID]) -> None:
    """Delete every entry of these pipelines (repository.forget_ended)."""
    conn.execute(timeline.delete().where(timeline.c.pipeline_id.in_(pipeline_ids)))
