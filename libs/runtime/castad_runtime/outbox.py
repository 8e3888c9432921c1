"""Write events to the outbox in the caller's transaction; republish the rows the relay parked."""

from __future__ import annotations

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
    append(conn, env)
    return env


def append(
    conn: sa.Connection, env: envelope_.Envelope, destination: str | None = None, delivery_id: uuid.UUID | None = None
) -> None:
    """An envelope as it is, to the events exchange or (`destination`) to one queue alone.

    `delivery_id` names the row and the message when the same event is sent again (a replayed dead
    letter): the envelope keeps its id, by which the consumer's inbox knows it.
    """
    conn.execute(
        tables.outbox.insert().values(
            event_id=delivery_id or env.id,
            pipeline_id=env.subject,
            routing_key=env.type,
            envelope=env.model_dump(mode="json"),
            destination=destination,
        )
    )
    db.mark_outbox_written(conn)


def republish(conn: sa.Connection, event_ids: Sequence[uuid.UUID]) -> int:
    """Hand parked rows back to the relay (once the cause is fixed): their tries start over.
    Returns how many were parked here; the relay is woken after the commit."""
    t = tables.outbox
    result = conn.execute(
        t.update()
        .where(t.c.event_id.in_(list(event_ids)), t.c.parked_at.is_not(None), t.c.published_at.is_(None))
        .values(parked_at=None, retry_at=None, publish_attempts=0, last_error=None)
    )
    if result.rowcount:
        db.mark_outbox_written(conn)
    return result.rowcount
