"""Write events to the outbox in the caller's transaction; read and mark them for the relay."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from castad_contracts import envelope as envelope_
from castad_contracts import events

from castad_runtime import db, tables, telemetry


def add(conn: sa.Connection, payload: events.Payload, event_type: str, source: str) -> envelope_.Envelope:
    """Record an event in the same transaction as the state change it announces.

    The current trace context goes into the envelope, so the consumer continues this trace.
    """
    traceparent, tracestate = telemetry.current_trace_headers()
    env = envelope_.wrap(payload, event_type, source, traceparent, tracestate)
    conn.execute(
        tables.outbox.insert().values(
            event_id=env.id,
            pipeline_id=env.subject,
            routing_key=env.type,
            envelope=env.model_dump(mode="json"),
        )
    )
    db.mark_outbox_written(conn)
    return env


@dataclasses.dataclass(frozen=True)
class Row:
    id: int
    event_id: uuid.UUID
    pipeline_id: str
    routing_key: str
    envelope: dict[str, object]
    created_at: dt.datetime


def pending(conn: sa.Connection, limit: int) -> list[Row]:
    """The oldest unpublished rows, in commit-independent insertion order."""
    t = tables.outbox
    result = conn.execute(
        sa.select(t.c.id, t.c.event_id, t.c.pipeline_id, t.c.routing_key, t.c.envelope, t.c.created_at)
        .where(t.c.published_at.is_(None))
        .order_by(t.c.id)
        .limit(limit)
    )
    return [Row(**row._mapping) for row in result]


def mark_published(conn: sa.Connection, ids: Sequence[int]) -> None:
    if ids:
        conn.execute(tables.outbox.update().where(tables.outbox.c.id.in_(ids)).values(published_at=sa.func.now()))
