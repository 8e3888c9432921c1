"""Engines, connections, transactions, and what runs once one committed (metrics, wake-ups).

What a transaction writes to the outbox or the gateway's timeline wakes their listeners once it
committed, never from inside it (castad_runtime.wakeups says why).

A database URL is SQLAlchemy's (`postgresql+psycopg://user:pw@host:port/db`), for a server with a
standby in its multi-host form (`postgresql+psycopg://user:pw@/db?host=h1:5432&host=h2:5432`), which
connects to whichever host takes writes (`target_session_attrs=read-write`, the default where several
hosts are named): after a failover, every new connection goes to the promoted standby. Every
connection, pooled or not, has a connect timeout, TCP keepalives and a user timeout (`TIMEOUTS`), so a
server that died without closing its sockets is given up within seconds, not the kernel's hours.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import os
import select
import socket
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Protocol

import psycopg
import sqlalchemy as sa
from psycopg import pq, rows
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect

from castad_runtime import outages

log = logging.getLogger(__name__)

OUTBOX_CHANNEL = "castad_outbox"
MAINTENANCE_DATABASE = "postgres"  # on every server: where databases are created, dropped and altered from
# libpq's connection parameters that bound every wait on a dead or unreachable server; a URL's own win.
TIMEOUTS: dict[str, int] = {
    "connect_timeout": 3,  # seconds, per host tried (libpq tries a multi-host URL's hosts in order)
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # ms: data sent and not acknowledged for this long ends the connection
}
_AFTER_COMMIT = "castad_after_commit"
_USED = "castad_used"  # a pooled connection's record: it was handed out before


def application_name() -> str:
    """How this process's sessions name themselves to PostgreSQL: `castad:<pid>@<host>`, at most 63 characters.

    An operator finds in pg_stat_activity which process holds a session (one idle in a transaction, say); the pid
    comes first, so that a long host name is what PostgreSQL cuts.
    """
    return f"castad:{os.getpid()}@{socket.gethostname()}"[:63]


def connect_args(url: str) -> dict[str, Any]:
    """What SQLAlchemy's engine for `url` must add to the URL's own parameters.

    `TIMEOUTS`, `application_name`, and `target_session_attrs=read-write` where the URL names several hosts (unless
    it says otherwise).
    """
    parsed = sa.engine.make_url(url)
    added: dict[str, Any] = {key: value for key, value in TIMEOUTS.items() if key not in parsed.query}
    if "application_name" not in parsed.query:
        added["application_name"] = application_name()
    hosts = parsed.query.get("host", ())
    named = [host for entry in ((hosts,) if isinstance(hosts, str) else hosts) for host in entry.split(",")]
    if len(named) > 1 and "target_session_attrs" not in parsed.query:  # ?host=a&host=b, or libpq's ?host=a,b
        added["target_session_attrs"] = "read-write"
    return added


def maintenance_url(url: str) -> str:
    """Return `url` with its server's maintenance database in place of its own (hosts, user and parameters kept)."""
    return sa.engine.make_url(url).set(database=MAINTENANCE_DATABASE).render_as_string(hide_password=False)


def maintenance_engine(url: str) -> sa.Engine:
    """Return an unpooled engine on the maintenance database of `url`'s server, in autocommit.

    CREATE, DROP and ALTER DATABASE run outside a transaction, and never in the database they are about.
    """
    return sa.create_engine(
        maintenance_url(url), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool, connect_args=connect_args(url)
    )


def connect_kwargs(url: str) -> dict[str, Any]:
    """The keyword arguments of `psycopg.connect` for `url`, as SQLAlchemy's engine would connect.

    The same serve `AsyncConnection.connect`: the URL's host or hosts, database, user and parameters, with
    `connect_args`.
    """
    parsed = sa.engine.make_url(url).set(drivername="postgresql+psycopg")
    _, kwargs = _PSYCOPG.create_connect_args(parsed)  # type: ignore[no-untyped-call]  # SQLAlchemy's dialect
    return {**kwargs, **connect_args(url)}


def database_name(url: str) -> str:
    """The name of the database a URL connects to."""
    return sa.engine.make_url(url).database or ""


_PSYCOPG = psycopg_dialect.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy's dialects are untyped


class _Limited(Protocol):
    """Settings with a service's session limits (settings.IdleInTransactionS, LockWaitS, StatementS)."""

    @property
    def db_idle_in_transaction_s(self) -> float: ...

    @property
    def db_lock_wait_s(self) -> float: ...

    @property
    def db_statement_s(self) -> float: ...


@dataclasses.dataclass(frozen=True)
class SessionLimits:
    """What PostgreSQL ends in a service's sessions (the settings IdleInTransactionS, LockWaitS, StatementS).

    Set by a statement when a session begins, not as a startup parameter: a pooler passes it on (PgBouncer drops
    or refuses `options`), and in transaction pooling every session of the pool is the same service's.
    """

    idle_in_transaction_s: float
    lock_wait_s: float
    statement_s: float = 60.0

    @classmethod
    def of(cls, config: _Limited) -> SessionLimits:
        """A service's limits, as its settings give them."""
        return cls(config.db_idle_in_transaction_s, config.db_lock_wait_s, config.db_statement_s)

    def statement(self) -> str:
        idle_ms, lock_ms = round(self.idle_in_transaction_s * 1000), round(self.lock_wait_s * 1000)
        statement_ms = round(self.statement_s * 1000)
        return (
            f"SET idle_in_transaction_session_timeout = {idle_ms}; SET lock_timeout = {lock_ms};"
            f" SET statement_timeout = {statement_ms}"
        )


# Sessions of this role in this database inside a transaction that wrote or locked rows (it has an id), and waiting
# on their client longer than `idle_s`: idle in it, or active and waiting for the rest of a pipelined batch.
# PostgreSQL's idle_in_transaction_session_timeout misses both once a session sent a pipelined batch (found with
# PostgreSQL 15 and psycopg 3.2: a batch that read a result midway leaves it unarmed for the rest of the
# transaction), and a pooler keeps it from reaching others.
_STUCK = """
SELECT pid, application_name, extract(epoch FROM now() - state_change)::float8, pg_terminate_backend(pid)
FROM pg_stat_activity
WHERE datname = current_database() AND usename = current_user AND pid <> pg_backend_pid()
  AND backend_xid IS NOT NULL AND state_change < now() - make_interval(secs => :idle_s)
  AND (state LIKE 'idle in transaction%' OR (state = 'active' AND wait_event = 'ClientRead'))
"""


class StuckSessions:
    """A thread that ends the service's own sessions stuck inside a transaction past its limit (`_STUCK`).

    What a process frozen there held (row locks on shared rows) is then free within its limit and a quarter of it,
    as PostgreSQL's own timeout would free it: every replica's thread looks every quarter of the limit, and one
    of them ends it. It reaches only the sessions of the service's role in the service's database.
    """

    def __init__(self, engine: sa.Engine, idle_s: float) -> None:
        self._engine, self.idle_s = engine, idle_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stuck-sessions", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.idle_s / 4):
            try:
                self.sweep()
            except Exception as error:  # the thread goes on: its next look
                if not outages.is_outage(error):
                    log.exception("looking for stuck sessions failed; looking again")

    def sweep(self) -> int:
        """End every such session now; how many."""
        with transaction(self._engine) as conn:
            ended = conn.execute(sa.text(_STUCK), {"idle_s": self.idle_s}).all()
        for pid, application, seconds, done in ended:
            log.warning(
                "session %s of %s %s: inside a transaction without a word for %.1f s, over its %g s",
                pid,
                application or "an unnamed process",
                "ended" if done else "not ended",
                seconds,
                self.idle_s,
            )
        return len(ended)


def make_engine(url: str, pool_size: int = 5, limits: SessionLimits | None = None) -> sa.Engine:
    """A pool of connections to `url`, each looked at before use (`_known_broken`) without a round trip.

    A pre-ping `SELECT 1` would cost one per transaction, and a commit in PostgreSQL's statistics. With `limits`,
    each new session is limited so as they say.
    """
    engine = sa.create_engine(
        url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=600, connect_args=connect_args(url)
    )
    sa.event.listen(engine, "checkout", _known_broken)
    sa.event.listen(engine, "before_cursor_execute", _not_pipelined)
    sa.event.listen(engine, "begin", _began)
    if limits is not None:
        sa.event.listen(engine, "connect", lambda connection, _: _limit(connection, limits))
    return engine


class TransactionOpen(RuntimeError):
    """Work that leaves Castad (a store, a provider, a webhook) was asked for inside a database transaction.

    A programming error: a slow or stuck call there holds the transaction's row locks for as long as it lasts, and
    a session idle in a transaction past its limit is ended (`SessionLimits`). Keep the call, then record it.
    """


_opened = threading.local()  # this thread's connections that began a transaction (`_began`)


def _began(conn: sa.Connection) -> None:
    """Note a connection of this thread beginning a transaction (SQLAlchemy's autobegin too), for `outside`."""
    if not hasattr(_opened, "connections"):
        _opened.connections = weakref.WeakSet()
    _opened.connections.add(conn)


def outside(what: str) -> None:
    """Raise TransactionOpen if this thread holds a transaction of an engine made by `make_engine` open.

    Called before work that leaves Castad (`artifacts`' stores, `outbound.Client`, and `Cancellation.call`, which
    runs a call out on a thread of its own): none of it may wait inside a transaction. A connection in autocommit
    holds none.
    """
    for conn in list(getattr(_opened, "connections", ())):
        autocommit = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
        if not conn.closed and conn.in_transaction() and not autocommit:
            raise TransactionOpen(f"{what} inside a database transaction")


def _limit(connection: psycopg.Connection[Any], limits: SessionLimits) -> None:
    with connection.cursor() as cursor:
        cursor.execute(limits.statement())
    connection.commit()


def _not_pipelined(conn: sa.Connection, cursor: Any, statement: str, *args: Any) -> None:
    """SQLAlchemy reads a statement's answer (rows, rowcount) as soon as it ran, which `pipelined` gives later."""
    driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
    if driver.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        raise RuntimeError(f"a SQLAlchemy statement in a pipelined block (use db.run): {statement[:80]}")


def _known_broken(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Whether a pooled connection must be replaced before use (closed, broken, or spoken to while idle).

    A pooled connection is replaced before use if psycopg knows it to be closed or broken, or if the server sent it
    anything while it sat idle in the pool: a server that ends a session (a restart, an outage's
    `pg_terminate_backend`, `idle_session_timeout`) says why and closes it, so its socket is readable. Nothing else
    comes to an idle pooled connection (none of them LISTENs); a notice that did would only cost a new connection.
    A new connection is not looked at, as a pre-ping would not: SQLAlchemy tries a checkout twice, and a second
    refusal would raise a bug's error instead of an outage's. A connection that died without a word (a network
    partition, a middlebox that dropped it) is found by its first statement instead of a ping: that work fails as
    in an outage (a request answers 503 with Retry-After, a consumer tries again, nothing used up), and
    `pool_recycle` bounds how old a pooled connection gets.
    """
    if dbapi_connection.closed or dbapi_connection.broken:
        raise sa.exc.DisconnectionError("the connection was closed or broken")
    if not record.info.get(_USED):  # cleared when the pool replaces the connection
        record.info[_USED] = True
        return
    poller = select.poll()
    poller.register(dbapi_connection.pgconn.socket, select.POLLIN)
    if poller.poll(0):
        raise sa.exc.DisconnectionError("the server sent something to an idle connection (it ended the session)")


def run(conn: sa.Connection, statement: str, params: Any = None, *, prepare: bool | None = None) -> psycopg.Cursor[Any]:
    """Run one of a package's hot-path statements straight on the psycopg connection of `conn`.

    The statement is plain SQL with psycopg's `%(name)s` placeholders, run in the transaction of `conn`: no
    SQLAlchemy compilation or result wrapping, and psycopg prepares a statement it has run a few times. Rows come
    as named tuples. Parameters that are JSON must be wrapped (`psycopg.types.json.Jsonb`). Write only inside
    `transaction` (SQLAlchemy commits it); on a plain `engine.connect()`, read only: SQLAlchemy rolls back what it
    does not know of.

    `prepare=False` (`REPLAN`) plans the statement at every run, for its parameters and its tables as they are
    then. Give it to a statement that finds its rows by an array of keys (`= ANY(%s)`, a join with the rows of
    a parameter): once prepared, PostgreSQL may keep a generic plan made while the table was small, a
    sequential scan, which then costs more with every row the table gains, until an ANALYZE of the table
    (autovacuum's, where it runs) makes it plan again."""
    driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
    return driver.cursor(row_factory=rows.namedtuple_row).execute(statement, params, prepare=prepare)


REPLAN = False  # `run(..., prepare=REPLAN)`: planned at every run (see `run`)


@contextlib.contextmanager
def pipelined(conn: sa.Connection) -> Iterator[None]:
    """Send the statements `run` runs inside without waiting for each one's answer (pipeline mode).

    This is psycopg's pipeline mode: an answer is waited for when its rows are read, and all of them when the block
    ends, which raises the first error. Several statements in a row then cost one round trip. Only `run` inside:
    SQLAlchemy expects each statement's answer at once, and its statements are refused there.
    """
    driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
    with driver.pipeline():
        yield


def seconds_from_now(seconds: float) -> sa.ColumnElement[dt.datetime]:
    """SQL for the database's now() plus `seconds` (its clock, not this process's)."""
    return sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.literal(seconds, sa.Float))


def expired(
    rows: sa.Select[Any], time_column: sa.Column[dt.datetime], older_than_s: float, limit: int
) -> sa.Select[Any]:
    """Retention's choice: up to `limit` of `rows` older than `older_than_s`, oldest first, locked.

    A row's age is its `time_column`'s, by the database's clock. Only rows of `time_column`'s table are locked;
    rows another transaction holds are skipped, never waited for.
    """
    return (
        rows.where(time_column < seconds_from_now(-older_than_s))
        .order_by(time_column)
        .limit(limit)
        .with_for_update(of=time_column.table, skip_locked=True)
    )


async def notifications(listener: psycopg.AsyncConnection[Any], timeout_s: float | None = None) -> list[psycopg.Notify]:
    """The notifications of a LISTENing connection.

    Those that came already, else those of the first wake-up within `timeout_s` (None: no limit; an empty list once
    it passed).

    The wait is one sleep until the connection's socket has something to read. psycopg's own wait for
    notifications (`notifies`) wakes every 0.1 s to look again: ten turns of the event loop a second for
    each listener, which cost a relay at rest more CPU than anything else it did."""
    came = [notice async for notice in listener.notifies(timeout=0)]
    if came:
        return came
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not readable.done():
            readable.set_result(None)

    socket = listener.pgconn.socket
    loop.add_reader(socket, wake)
    try:
        async with asyncio.timeout(timeout_s):
            await readable
    except TimeoutError:
        return []
    finally:
        loop.remove_reader(socket)
    return [notice async for notice in listener.notifies(timeout=0)]


def after_commit(conn: sa.Connection, callback: Callable[[], None], key: Hashable | None = None) -> None:
    """Call `callback` once this transaction has committed (not if it rolls back).

    For what must count only what committed, as a metric of an outcome. It must not fail; if it does, that is
    logged. Only a `transaction` runs them: anywhere else this raises RuntimeError, rather than the callback never
    running. A callback given with a `key` the transaction has one for already is not added again.
    """
    callbacks = conn.info.get(_AFTER_COMMIT)
    if callbacks is None:
        raise RuntimeError("db.after_commit outside a db.transaction: nothing would run the callback")
    callbacks.setdefault(object() if key is None else key, callback)


@contextlib.contextmanager
def transaction(engine: sa.Engine) -> Iterator[sa.Connection]:
    """One local transaction, then what was to run once it committed (`after_commit`)."""
    with engine.connect() as conn:
        conn.info[_AFTER_COMMIT] = {}
        try:
            with conn.begin():
                yield conn
        except BaseException:
            conn.info.pop(_AFTER_COMMIT, None)
            raise
        for callback in conn.info.pop(_AFTER_COMMIT, {}).values():
            try:
                callback()
            except Exception:
                log.exception("a callback after a commit failed")
