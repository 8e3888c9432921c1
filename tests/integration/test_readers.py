"""Replicas say what they read, and the relay publishes an event only to services that have a replica reading it.

Against real PostgreSQL and RabbitMQ: a replica's row in its service's `replicas` (castad_runtime.announcement),
and the relay (castad_relay.readers) holding a brief that only a newer release reads while every lyric replica
runs the release before, uncharged and saying why, then publishing it once a replica that reads it runs.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from castad_contracts import brief, events
from castad_relay import connection, readers, statements
from castad_relay import metrics as relay_metrics
from castad_runtime import announcement, db, metrics, tables
from castad_testkit import briefs

from tests.integration.helpers import pipeline_requested, write_events
from tests.support import waits

pytestmark = pytest.mark.integration

REQUESTED = events.PIPELINE_REQUESTED


@pytest.fixture
def lyric(engines) -> Iterator[sa.Engine]:
    """The lyric stage's database, its replicas' rows removed after the test (other tests' relays read them)."""
    engine = engines["lyric"]
    try:
        yield engine
    finally:
        with db.transaction(engine) as conn:
            conn.execute(tables.replicas.delete())


def rows(engine: sa.Engine) -> dict[str, sa.RowMapping]:
    with engine.connect() as conn:
        return {row["replica"]: row for row in conn.execute(sa.select(tables.replicas)).mappings()}


def say(engine: sa.Engine, replica: str, reads: dict[str, int]) -> None:
    announcement.Announcer(engine, replica, "0.0.1", reads).renew()


def test_a_replica_keeps_its_row_live_while_it_runs_and_no_longer_once_it_stops(lyric):
    with db.transaction(lyric) as conn:  # a replica killed long ago
        conn.execute(tables.replicas.insert().values(replica="lyric@gone:1", release="0.0.1", reads={}))
        conn.execute(sa.text("UPDATE replicas SET seen_at = now() - interval '8 days'"))
    announcer = announcement.Announcer(lyric, "lyric@here:7", "1.2.3", {REQUESTED: 4}, renew_s=0.05)

    announcer.start()
    waits.until(lambda: "lyric@here:7" in rows(lyric), what="the replica's row")
    first = rows(lyric)["lyric@here:7"]
    waits.until(lambda: rows(lyric)["lyric@here:7"]["seen_at"] > first["seen_at"], what="the row renewed")

    assert (first["release"], first["reads"]) == ("1.2.3", {REQUESTED: 4})
    assert set(rows(lyric)) == {"lyric@here:7"}  # the long-gone replica's row deleted on the way
    announcer.stop()
    assert not any(thread.is_alive() for thread in announcer.threads())
    with lyric.connect() as conn:  # kept, so that while no replica runs the one seen last still says what it reads
        live = conn.scalar(sa.text("SELECT seen_at >= now() - make_interval(secs => :s) FROM replicas"), {"s": 30})
    assert (set(rows(lyric)), live) == ({"lyric@here:7"}, False)


def test_a_brief_only_the_new_release_reads_waits_uncharged_until_a_lyric_replica_of_that_release_runs(
    installation, engines, lyric, amqp, start_relay, monkeypatch, caplog
):
    monkeypatch.setattr(readers, "FRESH_S", 0.2)
    monkeypatch.setattr(readers, "UNREAD_RECHECK_S", 0.2)
    caplog.set_level(logging.INFO, logger=readers.log.name)
    say(lyric, "lyric@old:1", {REQUESTED: 3})  # the release before: briefs without photo links
    api = engines["api"]
    linked = briefs.sample(photos=(brief.PhotoLink(url="https://photos.example.com/terrace.jpg"),))
    [new] = write_events(api, [pipeline_requested(brief=linked)], REQUESTED)
    [old] = write_events(api, [pipeline_requested()], REQUESTED)
    assert (new.schemaversion, old.schemaversion) == (4, 1)
    registry = metrics.registry()
    urls = installation.database_urls
    start_relay(metrics=relay_metrics.RelayMetrics(registry), sources={"api": urls["api"], "lyric": urls["lyric"]})

    queue = installation.topology.queue("lyric")
    assert [message.event_id for message in amqp.take(queue, 1)] == [old.id]
    unread = {"source": "api", "reason": relay_metrics.UNREAD}
    waits.until(
        lambda: (registry.get_sample_value("castad_relay_publish_failures_total", unread) or 0) >= 2,
        what="the brief held, looked at again and again",
    )
    held = outbox_row(api, new.id)
    assert (held["published_at"], held["publish_attempts"], held["parked_at"]) == (None, 0, None)
    assert held["last_error"] == (
        "waits for a replica of lyric that reads pipeline.requested version 4 (they read up to version 3); it goes"
        " out once one runs"
    )

    say(lyric, "lyric@new:1", {REQUESTED: 4})  # a replica of the new release starts beside the old one

    assert [message.event_id for message in amqp.take(queue, 1)] == [new.id]
    waits.until(lambda: outbox_row(api, new.id)["published_at"], what="the row marked published")
    said = [record.getMessage() for record in caplog.records if record.name == readers.log.name]
    assert said == [
        "events of type pipeline.requested version 4: waits for a replica of lyric that reads pipeline.requested"
        " version 4 (they read up to version 3); it goes out once one runs",
        "a replica of lyric reads pipeline.requested version 4: the events that waited for it go out",
    ]


def outbox_row(engine: sa.Engine, event_id: uuid.UUID) -> sa.RowMapping:
    with engine.connect() as conn:
        return conn.execute(sa.select(tables.outbox).where(tables.outbox.c.event_id == event_id)).mappings().one()


def test_an_event_a_live_replica_has_no_handler_for_waits_until_that_replica_is_gone(
    installation, engines, lyric, amqp, start_relay, monkeypatch
):
    """A type the lyric stage newly takes: its old replica would dead-letter it, so it waits while that one runs."""
    monkeypatch.setattr(readers, "FRESH_S", 0.2)
    monkeypatch.setattr(readers, "UNREAD_RECHECK_S", 0.2)
    say(lyric, "lyric@old:1", {"pipeline.cancel_requested": 2})  # takes no pipeline.requested
    say(lyric, "lyric@new:1", {REQUESTED: events.REGISTRY.current_version(REQUESTED)})
    api = engines["api"]
    [held] = write_events(api, [pipeline_requested()], REQUESTED)
    registry = metrics.registry()
    urls = installation.database_urls
    start_relay(metrics=relay_metrics.RelayMetrics(registry), sources={"api": urls["api"], "lyric": urls["lyric"]})

    unread = {"source": "api", "reason": relay_metrics.UNREAD}
    waits.until(
        lambda: (registry.get_sample_value("castad_relay_publish_failures_total", unread) or 0) >= 2,
        what="the event held while the old replica runs",
    )
    assert outbox_row(api, held.id)["last_error"] == (
        "waits until no replica of lyric that does not take pipeline.requested runs (it would dead-letter it); it goes"
        " out once they are replaced"
    )

    with db.transaction(lyric) as conn:  # the old replica stopped, as its rollout replaced it
        gone = sa.func.now() - sa.text("interval '1 hour'")
        conn.execute(tables.replicas.update().where(tables.replicas.c.replica == "lyric@old:1").values(seen_at=gone))
    assert [message.event_id for message in amqp.take(installation.topology.queue("lyric"), 1)] == [held.id]


def test_a_look_cut_short_while_its_session_is_set_up_closes_that_session(installation, monkeypatch):
    """The look's timeout may fall between connecting and the session's settings: the session is closed at once."""
    opened: list[psycopg.AsyncConnection] = []
    connect = psycopg.AsyncConnection.connect

    async def keeping(*args, **kwargs):
        opened.append(await connect(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", keeping)
    monkeypatch.setattr(statements, "PINNED", "SELECT pg_sleep(30)")  # the first setting, held up
    limits = db.SessionLimits(idle_in_transaction_s=5, lock_wait_s=5)

    async def look() -> None:
        setting_up = asyncio.create_task(connection.database(installation.database_urls["lyric"], limits))
        async with asyncio.timeout(30):  # connected, however busy the host: its first setting is under way
            while not opened:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        setting_up.cancel()  # as the look's timeout cancels it
        with pytest.raises(asyncio.CancelledError):
            await setting_up

    asyncio.run(look())
    assert [conn.closed for conn in opened] == [True]
