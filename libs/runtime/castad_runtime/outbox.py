"""Write events to the outbox in the caller's transaction; republish the rows the relay parked."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from castad_contracts import envelope as envelope_
from castad_contracts import events

from castad_runtime import db, tables, telemetry, wakeups

log = logging.getLogger(__name__)
APPEND = """
INSERT INTO outbox (event_id, pipeline_id, routing_key, envelope, destination) VALUES (%s, %s, %s, %s::jsonb, %s)
"""


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
    row = (delivery_id or env.id, env.subject, env.type, env.model_dump_json(), destination)
    db.run(conn, APPEND, row)
    wakeups.after_commit(conn, db.OUTBOX_CHANNEL)


def republish(conn: sa.Connection, event_ids: Sequence[uuid.UUID]) -> int:
    """Hand parked rows back to the relay (once the cause is fixed).

    Their tries start over. Returns how many were parked here; the relay is woken after the commit.
    """
    t = tables.outbox
    result = conn.execute(
        t.update()
        .where(t.c.event_id.in_(list(event_ids)), t.c.parked_at.is_not(None), t.c.published_at.is_(None))
        .values(parked_at=None, retry_at=None, publish_attempts=0, last_error=None)
    )
    if result.rowcount:
        wakeups.after_commit(conn, db.OUTBOX_CHANNEL)
    return result.rowcount


# Parked rows older than the retention (oldest first, locked, others' skipped), each deleted with the rows of its
# pipeline held behind it: nothing publishes a pipeline's later events after its earlier one is gone.
FORGET_PARKED = """
WITH doomed AS (
    SELECT id, pipeline_id FROM outbox
    WHERE published_at IS NULL AND parked_at < now() - make_interval(secs => %(older_than_s)s)
    ORDER BY parked_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox AS o USING doomed
WHERE o.pipeline_id = doomed.pipeline_id AND o.id >= doomed.id AND o.published_at IS NULL
"""


def forget_parked(conn: sa.Connection, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` rows parked more than `older_than_s` ago, each with the rows held behind it.

    How many rows in all; logged, for each is an event never published.
    """
    deleted = db.run(conn, FORGET_PARKED, {"older_than_s": older_than_s, "limit": limit}).rowcount
    if deleted:
        log.warning(
            "retention: deleted %d outbox rows parked over %.0f s ago, with those held behind them",
            deleted,
            older_than_s,
        )
    return deleted


def forget_published(conn: sa.Connection, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` rows the broker confirmed more than `older_than_s` ago; how many.

    Rows another transaction holds are skipped. A row not yet published, or parked, is never deleted.
    """
    t = tables.outbox
    doomed = db.expired(sa.select(t.c.id), t.c.published_at, older_than_s, limit)
    return conn.execute(t.delete().where(t.c.id.in_(doomed.scalar_subquery()))).rowcount
