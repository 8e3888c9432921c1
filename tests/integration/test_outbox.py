"""The transactional outbox on a real PostgreSQL.

Rows commit or vanish with the state change they announce, and the relay's wake-up (NOTIFY castad_outbox, sent by
the process's waker once the writer committed, never inside its transaction) reaches listeners after the commit
only, once per transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db, outbox, tables, wakeups
from castad_runtime.stage.repository import claiming

from tests.integration.helpers import count, lyric_started, outbox_rows, pipeline_requested

pytestmark = pytest.mark.integration

PROBE = "castad_test_probe"


class Boom(Exception):
    pass


@contextlib.contextmanager
def listening(url: str) -> Iterator[psycopg.Connection]:
    """A plain psycopg connection LISTENing on the outbox channel and on a probe channel."""
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute(f"LISTEN {db.OUTBOX_CHANNEL}")
        conn.execute(f"LISTEN {PROBE}")
        yield conn


def notifications_before_probe(listener: psycopg.Connection, engine: sa.Engine) -> list[str]:
    """Channels notified before a probe sent now from another session.

    Read once the waker of the engine's outbox sent what it had to.

    PostgreSQL delivers notifications in commit order, so once the probe arrives every
    notification committed earlier has arrived too: an empty list proves that none was sent.
    """
    url = engine.url.render_as_string(hide_password=False)
    assert wakeups.waker(url, db.OUTBOX_CHANNEL).settled()
    token = uuid.uuid4().hex
    with engine.connect() as conn:
        conn.execute(sa.select(sa.func.pg_notify(PROBE, token)))
        conn.commit()
    seen = []
    for notification in listener.notifies(timeout=5):
        if (notification.channel, notification.payload) == (PROBE, token):
            return seen
        seen.append(notification.channel)
    raise AssertionError(f"probe not received within 5 s (got {seen})")


def create_job(conn: sa.Connection, pipeline_id: str) -> None:
    trigger = pipeline_requested(pipeline_id)
    version, data = events.REGISTRY.oldest_carrying(events.PIPELINE_REQUESTED, trigger)
    claiming.accept_trigger(conn, pipeline_id, data, version, 3, None, None)


def test_outbox_row_commits_with_the_state_change_it_announces(engines):
    """Inside the transaction nobody else sees the job or its event; after commit both are there, as written."""
    engine = engines["lyric"]
    pipeline_id = str(uuid.uuid4())
    with db.transaction(engine) as conn:
        create_job(conn, pipeline_id)
        env = outbox.add(conn, lyric_started(pipeline_id, 1), events.stage_event(events.Stage.LYRIC, "started"), "/t")
        assert count(engine, tables.jobs) == 0
        assert outbox_rows(engine) == []

    assert count(engine, tables.jobs, tables.jobs.c.pipeline_id == pipeline_id) == 1
    [row] = outbox_rows(engine)
    assert (row.event_id, row.pipeline_id, row.routing_key, row.published_at) == (
        env.id,
        pipeline_id,
        "lyric.started",
        None,
    )
    with engine.connect() as conn:
        stored = conn.execute(sa.select(tables.outbox.c.envelope)).scalar_one()
    assert stored == env.model_dump(mode="json")


def test_outbox_row_disappears_with_a_rollback(engines):
    """An exception after the state change and its event were written leaves neither behind."""
    engine = engines["lyric"]
    pipeline_id = str(uuid.uuid4())
    with pytest.raises(Boom), db.transaction(engine) as conn:
        create_job(conn, pipeline_id)
        outbox.add(conn, lyric_started(pipeline_id, 1), "lyric.started", "/t")
        raise Boom()

    assert count(engine, tables.jobs) == 0
    assert outbox_rows(engine) == []


def test_notify_goes_out_once_after_commit_never_before(installation, engines):
    """No NOTIFY while the writing transaction is open; exactly one after it commits, however many rows."""
    engine = engines["lyric"]
    pipeline_id = str(uuid.uuid4())
    with listening(installation.database_urls["lyric"]) as listener:
        with db.transaction(engine) as conn:
            create_job(conn, pipeline_id)
            for attempt in (1, 2, 3):
                outbox.add(conn, lyric_started(pipeline_id, attempt), "lyric.started", "/t")
            assert notifications_before_probe(listener, engine) == []

        assert notifications_before_probe(listener, engine) == [db.OUTBOX_CHANNEL]
        assert len(outbox_rows(engine)) == 3


def test_no_notify_after_a_rollback_or_without_an_outbox_write(installation, engines):
    """A rolled-back outbox write wakes nobody, nor does a committed transaction that wrote no event."""
    engine = engines["lyric"]
    with listening(installation.database_urls["lyric"]) as listener:
        with pytest.raises(Boom), db.transaction(engine) as conn:
            outbox.add(conn, lyric_started(str(uuid.uuid4()), 1), "lyric.started", "/t")
            raise Boom()
        assert notifications_before_probe(listener, engine) == []

        with db.transaction(engine) as conn:
            create_job(conn, str(uuid.uuid4()))
        assert notifications_before_probe(listener, engine) == []

        # The next committed write wakes the relay again: the rollback left no stale state behind.
        with db.transaction(engine) as conn:
            outbox.add(conn, pipeline_requested(), events.PIPELINE_REQUESTED, "/t")
        assert notifications_before_probe(listener, engine) == [db.OUTBOX_CHANNEL]


def test_handing_back_a_parked_row_wakes_the_relay_though_no_row_is_inserted(installation, engines):
    """republish changes rows instead of inserting them: it wakes the relay as an insert does, after the commit."""
    engine = engines["lyric"]
    with db.transaction(engine) as conn:
        env = outbox.add(conn, pipeline_requested(), events.PIPELINE_REQUESTED, "/t")
    with engine.begin() as conn:
        conn.execute(tables.outbox.update().values(parked_at=sa.func.now(), publish_attempts=10))
    # The insert's own wake-up sent first: it would otherwise reach the listener during the hand-back.
    assert wakeups.waker(engine.url.render_as_string(hide_password=False), db.OUTBOX_CHANNEL).settled()
    with listening(installation.database_urls["lyric"]) as listener:
        with db.transaction(engine) as conn:
            assert outbox.republish(conn, [env.id]) == 1
            assert notifications_before_probe(listener, engine) == []
        assert notifications_before_probe(listener, engine) == [db.OUTBOX_CHANNEL]


def test_a_wake_up_its_waker_cannot_send_costs_the_writer_nothing_and_the_next_goes_out(installation, engines):
    """A wake-up its waker cannot send costs the writer nothing, and the next goes out.

    The writer's transaction sends no NOTIFY of its own (a listener that stopped reading would fail its commit). A
    waker whose session the server ended sends on a new one; one that cannot reach the server drops that wake-up,
    logged, and sends the next once it can.
    """
    engine = engines["lyric"]
    waker = wakeups.waker(engine.url.render_as_string(hide_password=False), db.OUTBOX_CHANNEL)

    def written() -> None:
        with db.transaction(engine) as conn:
            outbox.add(conn, pipeline_requested(), events.PIPELINE_REQUESTED, "/t")

    with listening(installation.database_urls["lyric"]) as listener:
        written()
        assert notifications_before_probe(listener, engine) == [db.OUTBOX_CHANNEL]
        assert waker._conn is not None  # noqa: SLF001 (the session the server is made to end)
        with engine.connect() as conn:
            conn.execute(sa.select(sa.func.pg_terminate_backend(waker._conn.info.backend_pid)))  # noqa: SLF001
        written()
        assert notifications_before_probe(listener, engine) == [db.OUTBOX_CHANNEL]  # on a new session

        url = waker._url  # noqa: SLF001 (stands for a server out of reach)
        waker._url = "postgresql+psycopg://postgres@127.0.0.1:9/nowhere"  # noqa: SLF001
        waker._close()  # noqa: SLF001 (settled: its thread is not using the connection)
        written()
        assert notifications_before_probe(listener, engine) == []  # dropped: the relay's own re-read finds it
        waker._url = url  # noqa: SLF001
        time.sleep(wakeups.RETRY_AFTER_S)
        written()
        assert notifications_before_probe(listener, engine) == [db.OUTBOX_CHANNEL]
        assert len(outbox_rows(engine)) == 4  # every writer committed


async def _listener(url: str) -> psycopg.AsyncConnection:
    listener = await psycopg.AsyncConnection.connect(url.replace("postgresql+psycopg://", "postgresql://", 1))
    await listener.set_autocommit(True)
    await listener.execute(f"LISTEN {PROBE}")
    return listener


def _notify(engine: sa.Engine, payload: str) -> None:
    with engine.connect() as conn:
        conn.execute(sa.select(sa.func.pg_notify(PROBE, payload)))
        conn.commit()


def test_a_listener_sleeping_until_its_socket_is_readable_wakes_at_each_notify(engines, installation):
    """db.notifications takes what came already without waiting, and a later NOTIFY ends its wait.

    A wait that ran out returns nothing, and the test's own limit would end one that never does.
    """
    engine = engines["lyric"]

    async def scenario() -> tuple[list[str], list[str], list[str]]:
        async with await _listener(installation.database_urls["lyric"]) as listener, asyncio.timeout(20):
            _notify(engine, "before")
            waiting = await db.notifications(listener)  # no limit: it must not wait for the one that came
            loop = asyncio.get_running_loop()
            later = loop.run_in_executor(None, lambda: (time.sleep(0.3), _notify(engine, "later")))
            woken = await db.notifications(listener, timeout_s=15)
            await later
            quiet = await db.notifications(listener, timeout_s=0.2)
        return [n.payload for n in waiting], [n.payload for n in woken], [n.payload for n in quiet]

    assert asyncio.run(scenario()) == (["before"], ["later"], [])
