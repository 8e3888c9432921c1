"""Engines, transactions and the post-commit outbox wake-up."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Iterator

import sqlalchemy as sa

log = logging.getLogger(__name__)

OUTBOX_CHANNEL = "castad_outbox"
_NOTIFY = "castad_notify"


def make_engine(url: str, pool_size: int = 5) -> sa.Engine:
    return sa.create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True, pool_recycle=600)


def seconds_from_now(seconds: float) -> sa.ColumnElement[dt.datetime]:
    """SQL for the database's now() plus `seconds` (its clock, not this process's)."""
    return sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.literal(seconds, sa.Float))


def notify_after_commit(conn: sa.Connection, channel: str, payload: str = "") -> None:
    """Send NOTIFY channel, payload once this transaction has committed."""
    conn.info.setdefault(_NOTIFY, set()).add((channel, payload))


def mark_outbox_written(conn: sa.Connection) -> None:
    notify_after_commit(conn, OUTBOX_CHANNEL)


@contextlib.contextmanager
def transaction(engine: sa.Engine) -> Iterator[sa.Connection]:
    """One local transaction, then its notifications (an outbox write wakes the relay).

    The NOTIFY is sent after the commit, in one autocommit statement of its own (one
    round trip, no BEGIN and COMMIT): a NOTIFY inside the writing transaction takes a
    cluster-wide lock at commit and holds it through the commit's WAL flush, which
    serialises every notifying writer (see BENCHMARKS.md). A lost notification only
    delays the rows until the relay's fallback poll, so a NOTIFY that fails is logged,
    not raised: the transaction it follows has committed, and its caller must not
    treat that work as undone.
    """
    with engine.connect() as conn:
        conn.info.pop(_NOTIFY, None)
        with conn.begin():
            yield conn
        notifications = conn.info.pop(_NOTIFY, None)
        if notifications:
            # The isolation level goes back to the default when the connection returns to the pool.
            conn.execution_options(isolation_level="AUTOCOMMIT")
            calls = [sa.func.pg_notify(channel, payload) for channel, payload in sorted(notifications)]
            try:
                conn.execute(sa.select(*calls))
            except sa.exc.DBAPIError as error:
                log.warning("NOTIFY after commit failed, listeners catch up by polling: %s", error)
