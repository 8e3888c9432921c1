"""Record processed event ids in the handler's transaction: effects happen once. Retention forgets them later."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

import sqlalchemy as sa
from castad_contracts import envelope as envelope_

from castad_runtime import db, tables

T = TypeVar("T")
R = TypeVar("R")


RECORD = """
INSERT INTO inbox (event_id, event_type, pipeline_id) VALUES (%s, %s, %s)
ON CONFLICT DO NOTHING RETURNING event_id
"""


RECORD_ALL = """
INSERT INTO inbox (event_id, event_type, pipeline_id)
SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[]) ON CONFLICT DO NOTHING RETURNING event_id
"""


def record_all(conn: sa.Connection, envs: Sequence[envelope_.Envelope]) -> Callable[[], set[uuid.UUID]]:
    """Record these events' ids in one statement (in `db.pipelined`, sent at once).

    Read later, the ids seen for the first time (an id given twice is new once).
    """
    columns = ([env.id for env in envs], [env.type for env in envs], [env.subject for env in envs])
    recorded = db.run(conn, RECORD_ALL, columns)
    return lambda: {row.event_id for row in recorded.fetchall()}


def forget_one(conn: sa.Connection, event_id: uuid.UUID) -> None:
    """Take back an event's row this transaction recorded (`record_all`), as if it had not come yet."""
    db.run(conn, "DELETE FROM inbox WHERE event_id = %s", (event_id,))


def first_delivery(conn: sa.Connection, env: envelope_.Envelope) -> bool:
    """True the first time this event id is seen; False for a redelivery or duplicate."""
    return db.run(conn, RECORD, (env.id, env.type, env.subject)).fetchone() is not None


def once(
    engine: sa.Engine,
    env: envelope_.Envelope,
    step: Callable[[sa.Connection], T],
    seen_again: Callable[[str], None] | None = None,
) -> T | None:
    """`step(conn)` in one transaction with the event's inbox row, the first time the event comes.

    What it returns. A duplicate runs nothing (None), and once its transaction committed its type is passed to
    `seen_again` (a metric).
    """
    with db.transaction(engine) as conn:
        if first_delivery(conn, env):
            return step(conn)
        if seen_again is not None:
            db.after_commit(conn, lambda: seen_again(env.type))
        return None


def once_read_first(
    engine: sa.Engine,
    env: envelope_.Envelope,
    read: Callable[[sa.Connection], R],
    step: Callable[[sa.Connection, R], T],
    seen_again: Callable[[str], None] | None = None,
) -> T | None:
    """`once` for a step that first reads or locks what it changes, in two round trips.

    `read` must change nothing: it runs for a duplicate too. The inbox row goes to the server with `read`'s
    statements, and the step's own statements go together, each lot in one round trip (`db.pipelined`). What
    `step(conn, what read returned)` returns; None for a duplicate.
    """
    with db.transaction(engine) as conn, db.pipelined(conn):
        recorded = db.run(conn, RECORD, (env.id, env.type, env.subject))
        found = read(conn)
        if recorded.fetchone() is not None:
            return step(conn, found)
        if seen_again is not None:
            db.after_commit(conn, lambda: seen_again(env.type))
        return None


def forget(conn: sa.Connection, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` event ids received more than `older_than_s` ago; how many.

    Rows another transaction holds are skipped. A copy of such an event coming later would be taken as new.
    """
    t = tables.inbox
    doomed = db.expired(sa.select(t.c.event_id), t.c.received_at, older_than_s, limit)
    return conn.execute(t.delete().where(t.c.event_id.in_(doomed.scalar_subquery()))).rowcount
