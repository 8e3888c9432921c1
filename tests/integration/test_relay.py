"""The outbox relay against real PostgreSQL and RabbitMQ, running in this process.

Rows are written as services write them (outbox.add in a committed transaction) and read
back from the installation's queues with pika. A broker outage is faked with a TCP proxy
between the relay and the shared RabbitMQ, which other tests keep using.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pika.exceptions
import psycopg
import pytest
import sqlalchemy as sa
from castad_contracts import events
from castad_faults.proxy import address_of, running_proxy, through
from castad_relay import bindings, leadership, publisher, pushback, relay, statements
from castad_relay import metrics as relay_metrics
from castad_relay import settings as relay_settings
from castad_runtime import db, metrics, outbox, tables
from castad_testkit import briefs

from tests.integration.helpers import (
    UNHEARD,
    Delivered,
    LoopThread,
    OutboxRow,
    all_published,
    hear_only_started,
    lyric_started,
    outbox_rows,
    output,
    pipeline_requested,
    write_events,
    write_unroutable,
)
from tests.support import waits

pytestmark = pytest.mark.integration

STARTED = events.stage_event(events.Stage.LYRIC, "started")  # bound to the gateway's queue
SONG_STARTED = events.stage_event(events.Stage.SONG, "started")


def interleaved(
    pipelines: Sequence[str], per_pipeline: int, seed: int, stage: events.Stage = events.Stage.LYRIC
) -> list[events.StageStarted]:
    """`per_pipeline` events of each pipeline, attempt 1..n in order per pipeline, shuffled across pipelines."""
    rng = random.Random(seed)
    pending = {pipeline: list(range(1, per_pipeline + 1)) for pipeline in pipelines}
    result = []
    while pending:
        pipeline = rng.choice(sorted(pending))
        result.append(lyric_started(pipeline, pending[pipeline].pop(0), stage))
        if not pending[pipeline]:
            del pending[pipeline]
    return result


def sequences(delivered: Iterable[Delivered]) -> dict[str, list[int]]:
    """Per pipeline, the attempt numbers in the order the queue delivered them."""
    result: dict[str, list[int]] = defaultdict(list)
    for message in delivered:
        data = message.document["data"]
        result[data["pipeline_id"]].append(data["attempt"])
    return dict(result)


def without(document: dict[str, object], keys: set[str]) -> dict[str, object]:
    return {key: value for key, value in document.items() if key not in keys}


def unpublished(engine: sa.Engine) -> list[bool]:
    """Per outbox row, in insertion order: is it still waiting?"""
    return [row.published_at is None for row in outbox_rows(engine)]


def published(rows: Iterable[OutboxRow]) -> set[uuid.UUID]:
    return {row.event_id for row in rows if row.published_at is not None}


def sessions(engine: sa.Engine, where: str) -> int:
    """The other sessions on the engine's database that match `where`, a condition on pg_stat_activity."""
    query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    with engine.connect() as conn:
        return conn.execute(sa.text(f"{query} AND {where}")).scalar_one()


LISTENING = "query ILIKE 'LISTEN%'"  # a listener's last statement: it then only waits for notifications


@contextlib.contextmanager
def replicas(
    config: relay_settings.RelaySettings, exchange: str
) -> Iterator[tuple[list[LoopThread], list[relay.SourceRelay]]]:
    """Two relays on the first source of `config`, as two processes would run them.

    Each with its event loop and its publisher.
    """
    loops = [LoopThread(), LoopThread()]
    publishers = [
        publisher.Publisher(config.amqp_url, exchange, config.confirm_timeout_s, config.max_message_bytes)
        for _ in loops
    ]
    try:
        yield (
            loops,
            [
                relay.SourceRelay("lyric", config.sources["lyric"], each, config, "unused.dead-letter")
                for each in publishers
            ],
        )
    finally:
        for loop, each in zip(loops, publishers, strict=True):
            loop.submit(each.close()).result(timeout=5)
            loop.close()


def started_with_a_leader(loops: list[LoopThread], relays: list[relay.SourceRelay], engine: sa.Engine) -> int:
    """Run the relays; once a first row was published, which of them leads."""
    for loop, each in zip(loops, relays, strict=True):
        loop.submit(each.run_forever())
    write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
    waits.until(lambda: all_published(engine), what="a first row published")
    # The relay counts a row once its mark is committed: a moment after the row shows published.
    waits.until(lambda: any(each.published for each in relays), what="the relay that published it counting it")
    return next(i for i, each in enumerate(relays) if each.published)


def lease_row(engine: sa.Engine) -> sa.Row[Any]:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT term, holder, expires_at > now() AS live FROM outbox_leader")).one()


def test_committed_rows_reach_the_bound_queues_as_envelopes(installation, engines, amqp, start_relay):
    """Rows of several source databases reach the bound queues once each, then are marked published.

    They are published to the topic exchange, routed by event type, each as the CloudEvents envelope it was written
    as.
    """
    topology = installation.topology
    start_relay(fallback_poll_s=30)
    pipeline_id = str(uuid.uuid4())
    requested = write_events(engines["api"], [pipeline_requested(pipeline_id)], events.PIPELINE_REQUESTED)
    started = write_events(engines["lyric"], [lyric_started(pipeline_id, 1)], STARTED)
    started += write_events(engines["song"], [lyric_started(pipeline_id, 2, events.Stage.SONG)], SONG_STARTED)

    for service in ("api", "lyric", "song"):
        waits.until(lambda service=service: all_published(engines[service]), what=f"{service} outbox published")
    [to_lyric] = amqp.take(topology.queue("lyric"), 1)
    to_api = amqp.take(topology.queue("api"), 2)

    trace_fields = {"traceparent", "tracestate"}  # the relay's publish span continues the trace
    assert without(to_lyric.document, trace_fields) == without(requested[0].model_dump(mode="json"), trace_fields)
    assert to_lyric.routing_key == events.PIPELINE_REQUESTED
    assert to_lyric.properties.message_id == str(requested[0].id)
    assert to_lyric.properties.delivery_mode == 2
    assert to_lyric.properties.content_type == "application/cloudevents+json"
    assert sorted(message.event_id for message in to_api) == sorted(env.id for env in started)
    assert {message.routing_key for message in to_api} == {STARTED, SONG_STARTED}
    assert outbox_rows(engines["video"]) == []
    assert amqp.take_all(topology.queue("api")) == [] and amqp.take_all(topology.queue("lyric")) == []


def lyric_completed(pipeline_id: str) -> events.LyricCompleted:
    """lyric.completed, which the gateway's queue and the song stage's take."""
    made = output()
    return events.LyricCompleted(
        pipeline_id=pipeline_id,
        stage=events.Stage.LYRIC,
        job_id=str(uuid.uuid4()),
        attempt=1,
        artifact=made.artifact,
        completed_at=dt.datetime.now(dt.UTC),
        brief=briefs.sample(),
        **made.details,
    )


def test_an_event_waits_uncharged_for_a_queue_that_must_take_it_until_it_exists_then_reaches_each(
    installation, engines, amqp, start_relay, caplog
):
    """The song stage's queue is not there yet (its service never started, set-up did not declare it).

    lyric.completed, which the gateway's queue would take at once, waits for it: not published to the gateway's
    queue alone, not charged a try, said once in the log, counted. Other events go out meanwhile. Once the queue
    exists, bare, as a service of an earlier release or set-up may leave it, the relay binds it and the event
    reaches both queues.
    """
    topo = installation.topology
    engine = engines["lyric"]
    amqp.channel.queue_delete(topo.queue("song"))
    registry = metrics.registry()
    [done] = write_events(engine, [lyric_completed(str(uuid.uuid4()))], "lyric.completed")
    [other] = write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
    start_relay(metrics=relay_metrics.RelayMetrics(registry), sources={"lyric": installation.database_urls["lyric"]})

    waits.until(lambda: outbox_row(engine, other.id)["published_at"], what="another pipeline's row published")
    waiting = {"source": "lyric", "reason": relay_metrics.QUEUE_MISSING}
    waits.until(
        lambda: (registry.get_sample_value("castad_relay_publish_failures_total", waiting) or 0) >= 3,
        what="the row waiting, tried again and again",
    )
    row = outbox_row(engine, done.id)
    assert (row["published_at"], row["publish_attempts"], row["parked_at"]) == (None, 0, None)
    assert row["last_error"] == f"waits for queue {topo.queue('song')}, which must take it and does not exist yet"
    assert [message.event_id for message in amqp.take_all(topo.queue("api"))] == [other.id]
    said = [record.getMessage() for record in caplog.records if record.name == bindings.log.name]
    assert said == [
        f"events of type lyric.completed wait until queue {topo.queue('song')} exists: start the song service, or"
        " declare the topology (castad-admin topology)"
    ]

    amqp.channel.queue_declare(topo.queue("song"), durable=True, arguments=topo.queue_arguments())
    waits.until(lambda: outbox_row(engine, done.id)["published_at"], what="the row published once the queue exists")
    assert [message.event_id for message in amqp.take(topo.queue("song"), 1)] == [done.id]
    assert [message.event_id for message in amqp.take(topo.queue("api"), 1)] == [done.id]


def test_a_full_queue_holds_its_events_in_the_outbox_one_probing_until_it_has_room(
    installation, engines, amqp, start_relay, caplog
):
    """The song stage's queue is at its length limit and refuses what comes (reject-publish): the broker nacks.

    lyric.completed waits in the outbox, uncharged, never parked, said once in the log and counted, while other events
    go out; only one row probes the queue now and then, so the gateway's queue, which took each refused publish too,
    gets few copies. Once the song stage takes what its queue holds, every row reaches it, once.
    """
    topo = installation.topology
    engine = engines["lyric"]
    full = topo.queue("song")
    amqp.channel.queue_delete(full)
    amqp.channel.queue_declare(full, durable=True, arguments={**topo.queue_arguments(), "x-max-length": 2})
    fillers = 0
    with contextlib.suppress(pika.exceptions.NackError):  # full before the relay starts: a quorum queue refuses
        while fillers < 10:  # once it is over its limit, so it may take one more, and publishes in flight race it
            amqp.channel.basic_publish("", full, b"{}")
            fillers += 1
    try:
        registry = metrics.registry()
        done = write_events(engine, [lyric_completed(str(uuid.uuid4())) for _ in range(6)], "lyric.completed")
        [other] = write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
        start_relay(
            metrics=relay_metrics.RelayMetrics(registry), sources={"lyric": installation.database_urls["lyric"]}
        )

        def failures(reason: str) -> float:
            labels = {"source": "lyric", "reason": reason}
            return registry.get_sample_value("castad_relay_publish_failures_total", labels) or 0

        waits.until(lambda: outbox_row(engine, other.id)["published_at"], what="another type's row published")
        waits.until(
            lambda: failures(relay_metrics.PUSHED_BACK) >= 12,
            what="the rows for the full queue held, one probing again and again",
            timeout_s=30,
        )
        rows = [outbox_row(engine, envelope.id) for envelope in done]
        waiting = [row for row in rows if row["published_at"] is None]
        assert len(waiting) == 6
        assert {(row["publish_attempts"], row["parked_at"]) for row in waiting} == {(0, None)}
        assert {row["last_error"] for row in waiting} == {pushback.PushedBack("lyric.completed", 0).reason()}
        said = [record.getMessage() for record in caplog.records if record.name == pushback.log.name]
        assert len(said) == 1 and said[0].startswith("the broker refuses publishes to lyric.completed")
        nacked = failures(relay_metrics.NACKED)
        to_api = [message.event_id for message in amqp.take_all(topo.queue("api"))]
        nacked_after, held = failures(relay_metrics.NACKED), failures(relay_metrics.PUSHED_BACK)
        assert set(to_api) == {other.id, *(envelope.id for envelope in done)}
        # Each refused publish left a copy in the gateway's queue; most holds sent nothing (sending every waiting
        # row again, as each hold would, copies one each time).
        assert nacked <= len(to_api) - 1 <= nacked_after < held

        # Room again, as the song stage takes what its queue holds.
        taken = [message.body for message in amqp.take(full, fillers + 6, timeout=60)]
        assert taken[:fillers] == [b"{}"] * fillers
        assert sorted(json.loads(body)["id"] for body in taken[fillers:]) == sorted(str(e.id) for e in done)
        waits.until(lambda: all_published(engine), what="every row published")
        assert {outbox_row(engine, envelope.id)["publish_attempts"] for envelope in done} == {0}
    finally:
        amqp.channel.queue_delete(full)
        amqp.channel.queue_declare(full, durable=True, arguments=topo.queue_arguments())


def test_order_per_pipeline_holds_across_many_batches(installation, engines, amqp, start_relay):
    """60 rows of 4 interleaved pipelines, in batches of 7, half written before the relay starts.

    Every row arrives exactly once and each pipeline's rows arrive in the order they were written.
    """
    pipelines = [str(uuid.uuid4()) for _ in range(4)]
    payloads = interleaved(pipelines, 15, seed=1)
    write_events(engines["lyric"], payloads[:30], STARTED)
    start_relay(batch_size=7, fallback_poll_s=30)
    write_events(engines["lyric"], payloads[30:], STARTED)

    waits.until(lambda: all_published(engines["lyric"]), timeout_s=15, what="60 rows published")
    delivered = amqp.take_all(installation.topology.queue("api"))

    assert len(delivered) == 60
    assert len({message.event_id for message in delivered}) == 60
    assert sequences(delivered) == {pipeline: list(range(1, 16)) for pipeline in pipelines}


def test_a_notify_wakes_the_relay_long_before_its_fallback_poll(engines, start_relay):
    """With a 30 s fallback poll, each new row is published within a couple of seconds of its commit."""
    engine = engines["lyric"]
    start_relay(fallback_poll_s=30)
    write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
    waits.until(lambda: all_published(engine), what="the first row published")  # the relay is past its first drain

    for attempt in (1, 2, 3):
        write_events(engine, [lyric_started(str(uuid.uuid4()), attempt)], STARTED)
        waits.until(lambda: all_published(engine), timeout_s=5, what="a row published on NOTIFY, not on the 30 s poll")


def outbox_row(engine: sa.Engine, event_id: uuid.UUID) -> sa.RowMapping:
    with engine.connect() as conn:
        return conn.execute(sa.select(tables.outbox).where(tables.outbox.c.event_id == event_id)).mappings().one()


def publish_delay_s(engine: sa.Engine, event_id: uuid.UUID) -> float:
    row = outbox_row(engine, event_id)
    return (row["published_at"] - row["created_at"]).total_seconds()


def test_a_refused_row_backs_off_then_parks_holding_back_only_the_later_rows_of_its_pipeline(
    installation, engines, amqp, start_relay, monkeypatch
):
    """A refused row backs off, then parks, holding back only the later rows of its pipeline.

    A row RabbitMQ cannot route is tried again with a growing delay and parked after its third try, with the
    reason; no later row of its pipeline goes out meanwhile, while other pipelines' rows go out in milliseconds.
    After the fix (a queue bound) an operator republishes it: it and the rows it held back go out, in order, each
    once.
    """
    engine = engines["lyric"]
    api_queue = installation.topology.queue("api")
    hear_only_started(amqp, installation.topology, monkeypatch)
    stuck = str(uuid.uuid4())
    [first] = write_events(engine, [lyric_started(stuck, 1)], STARTED)
    refused = write_unroutable(engine, stuck)
    [after] = write_events(engine, [lyric_started(stuck, 3)], STARTED)
    start_relay(fallback_poll_s=30, retry_delay_s=0.2, max_publish_attempts=3)

    waits.until(lambda: outbox_row(engine, refused)["publish_attempts"] >= 1, what="a first refusal")
    for _ in range(10):  # while it backs off, and once it is parked
        [free] = write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
        waits.until(lambda free=free: outbox_row(engine, free.id)["published_at"] is not None, timeout_s=5)
        assert publish_delay_s(engine, free.id) < 0.5
        time.sleep(0.1)
    parked = waits.until(lambda: outbox_row(engine, refused)["parked_at"], timeout_s=10, what="the row parked")

    row = outbox_row(engine, refused)
    assert (row["publish_attempts"], row["last_error"]) == (3, "returned by the broker: NO_ROUTE")
    assert parked >= row["created_at"]
    assert outbox_row(engine, after.id)["published_at"] is None
    assert sequences(amqp.take_all(api_queue))[stuck] == [1]
    with engine.connect() as conn:
        parked_rows = conn.execute(sa.select(tables.outbox.c.event_id).where(tables.outbox.c.parked_at.is_not(None)))
        assert list(parked_rows.scalars()) == [refused]

    amqp.channel.queue_declare(f"{installation.namespace}.unheard", exclusive=True)  # gone with the connection
    amqp.channel.queue_bind(f"{installation.namespace}.unheard", installation.topology.exchange, UNHEARD)
    with db.transaction(engine) as conn:
        assert outbox.republish(conn, [refused]) == 1
    waits.until(lambda: all_published(engine), what="the republished row and the one it held back")

    rows = {row.event_id: row for row in outbox_rows(engine)}
    assert rows[first.id].published_at <= rows[refused].published_at <= rows[after.id].published_at
    [unheard] = amqp.take(f"{installation.namespace}.unheard", 1)
    assert unheard.event_id == refused
    assert sequences(amqp.take_all(api_queue))[stuck] == [3]


def test_a_refused_row_that_comes_due_while_a_backlog_drains_still_goes_before_the_rest_of_its_pipeline(
    installation, engines, amqp, start_relay, monkeypatch
):
    """A backlog drained in batches of 3.

    A row of one pipeline that the broker keeps refusing comes due again and again meanwhile (backoff capped at 0.1
    s). Each time it is due it goes out before its pipeline's later row, at the end of the backlog, and is refused
    again: that row is never published.
    """
    engine = engines["lyric"]
    hear_only_started(amqp, installation.topology, monkeypatch)
    stuck = str(uuid.uuid4())
    others = [str(uuid.uuid4()) for _ in range(50)]
    [first] = write_events(engine, [lyric_started(stuck, 1)], STARTED)
    refused = write_unroutable(engine, stuck)
    backlog = write_events(engine, [lyric_started(pipeline, n) for n in range(1, 13) for pipeline in others], STARTED)
    [held] = write_events(engine, [lyric_started(stuck, 3)], STARTED)
    start_relay(
        batch_size=3, fallback_poll_s=30, retry_delay_s=0.05, publish_backoff_max_s=0.1, max_publish_attempts=1000
    )

    waits.until(
        lambda: sum(unpublished(engine)) <= 2 and outbox_row(engine, refused)["publish_attempts"] >= 5,
        timeout_s=60,
        what="the backlog published, the row refused again and again",
    )
    assert outbox_row(engine, held.id)["published_at"] is None
    delivered = amqp.take_all(installation.topology.queue("api"))
    assert len(delivered) == 1 + len(backlog)
    assert sequences(delivered)[stuck] == [1]


def test_more_refused_rows_than_a_batch_do_not_stop_the_relay(installation, engines, amqp, start_relay, monkeypatch):
    """250 rows of 250 pipelines, all unroutable, ahead of good ones (a batch is 200 rows).

    The good rows go out as soon as the refused ones are backing off.
    """
    engine = engines["lyric"]
    hear_only_started(amqp, installation.topology, monkeypatch)
    for _ in range(250):
        write_unroutable(engine, str(uuid.uuid4()))
    good = write_events(engine, [lyric_started(str(uuid.uuid4()), 1) for _ in range(5)], STARTED)
    start_relay(fallback_poll_s=30, retry_delay_s=5.0)

    # Refusing 250 rows one by one takes a few seconds on a loaded 2-core host; stuck behind them until they parked
    # (ten tries each, backing off from 5 s), the good rows would wait minutes.
    waits.until(
        lambda: all(outbox_row(engine, env.id)["published_at"] for env in good), timeout_s=30, what="the good rows"
    )
    assert len(amqp.take(installation.topology.queue("api"), 5)) == 5


def test_published_at_is_set_only_once_the_confirm_arrives(installation, engines, amqp, start_relay):
    """A row is marked published only once the broker's confirm arrives.

    With the broker's replies held back, a row already sitting in its queue is still unpublished in the outbox; it
    is marked once the confirm gets through.
    """
    engine = engines["lyric"]
    api_queue = installation.topology.queue("api")
    with running_proxy(address_of(installation.amqp_url)) as proxy:
        start_relay(amqp_url=through(installation.amqp_url, proxy.port), fallback_poll_s=30, confirm_timeout_s=30)
        write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
        waits.until(lambda: all_published(engine), what="a first row over the proxy")
        amqp.take(api_queue, 1)

        proxy.hold()
        [held] = write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
        [in_queue] = amqp.take(api_queue, 1)
        assert in_queue.event_id == held.id
        assert outbox_rows(engine)[-1].published_at is None

        proxy.restore()
        waits.until(lambda: all_published(engine), what="the row marked after its confirm")
        assert amqp.take_all(api_queue) == []


def test_a_confirmed_row_is_marked_once_its_batch_is_settled(engines, amqp, installation, start_relay):
    """No later row, no NOTIFY, no fallback poll: the mark does not wait for the next look for rows."""
    engine = engines["lyric"]
    start_relay(fallback_poll_s=30)
    write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
    waits.until(lambda: all_published(engine), timeout_s=2, what="the row marked alone")
    amqp.take(installation.topology.queue("api"), 1)
    write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
    waits.until(lambda: all_published(engine), timeout_s=2, what="the next row marked alone")


def test_a_relay_stopped_while_it_marks_rows_marks_them_on_its_way_out(
    engines, amqp, installation, start_relay, monkeypatch
):
    """The stop cancels the mark of a confirmed row.

    The relay marks it once more before it leaves (within `retry_delay_s`), so the row is not sent again by the
    next relay. Each mark is slowed to 3 s here.
    """
    engine = engines["lyric"]
    slow_mark = statements.MARK_PUBLISHED + " AND (SELECT true FROM pg_sleep(3))"
    monkeypatch.setattr(statements, "MARK_PUBLISHED", slow_mark)
    running = start_relay(fallback_poll_s=30, retry_delay_s=8)
    write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
    amqp.take(installation.topology.queue("api"), 1)
    time.sleep(1)  # the broker confirmed it: its mark sleeps
    assert unpublished(engine) == [True]

    running.stop()

    assert unpublished(engine) == [False]


def test_a_broker_outage_only_makes_rows_wait(installation, engines, amqp, start_relay):
    """While the broker is unreachable rows stay unpublished and none is lost.

    Once it is back the relay resumes by itself (no NOTIFY, no fallback poll) and publishes each row once, in order
    per pipeline.
    """
    api_queue = installation.topology.queue("api")
    pipelines = [str(uuid.uuid4()) for _ in range(3)]
    with running_proxy(address_of(installation.amqp_url)) as proxy:
        start_relay(amqp_url=through(installation.amqp_url, proxy.port), fallback_poll_s=30, confirm_timeout_s=2)
        write_events(engines["lyric"], [lyric_started(pipeline, 1) for pipeline in pipelines], STARTED)
        waits.until(lambda: all_published(engines["lyric"]), what="rows before the outage")
        amqp.take(api_queue, 3)

        proxy.cut()
        waiting = interleaved(pipelines, 8, seed=2)
        write_events(engines["lyric"], waiting[:12], STARTED)
        song_waiting = [lyric_started(p.pipeline_id, p.attempt, events.Stage.SONG) for p in waiting[12:]]
        write_events(engines["song"], song_waiting, SONG_STARTED)
        waits.until(lambda: proxy.refused >= 3, what="the relay trying to reconnect")
        assert unpublished(engines["lyric"]) == [False] * 3 + [True] * 12
        assert unpublished(engines["song"]) == [True] * 12
        assert amqp.depth(api_queue) == 0

        proxy.restore()
        for service in ("lyric", "song"):
            waits.until(lambda service=service: all_published(engines[service]), what=f"{service} rows after")
    delivered = amqp.take_all(api_queue)

    assert sorted(message.event_id for message in delivered) == sorted(
        row.event_id for row in outbox_rows(engines["lyric"])[3:] + outbox_rows(engines["song"])
    )
    lyric_ids = {row.event_id for row in outbox_rows(engines["lyric"])}
    from_lyric = [message for message in delivered if message.event_id in lyric_ids]
    from_song = [message for message in delivered if message.event_id not in lyric_ids]
    for source in (from_lyric, from_song):  # each source's pipelines in the order their rows were written
        assert all(attempts == sorted(attempts) for attempts in sequences(source).values())


def test_a_broker_that_stops_answering_only_makes_rows_wait(installation, engines, amqp, start_relay):
    """A network partition.

    The relay's connection and every new one go silent, nothing is closed. The relay gives up on silent connections
    (after confirm_timeout_s) instead of waiting forever, and publishes every row once, in order per pipeline, when
    the network heals.
    """
    engine = engines["lyric"]
    api_queue = installation.topology.queue("api")
    pipelines = [str(uuid.uuid4()) for _ in range(3)]
    with running_proxy(address_of(installation.amqp_url)) as proxy:
        start_relay(amqp_url=through(installation.amqp_url, proxy.port), fallback_poll_s=30, confirm_timeout_s=1)
        write_events(engine, [lyric_started(pipelines[0], 1)], STARTED)
        waits.until(lambda: all_published(engine), what="a row before the partition")
        amqp.take(api_queue, 1)

        proxy.blackhole()
        write_events(engine, interleaved(pipelines, 4, seed=4), STARTED)
        waits.until(lambda: proxy.swallowed >= 2, what="the relay abandoning silent connections")
        assert unpublished(engine) == [False] + [True] * 12

        proxy.restore()
        waits.until(lambda: all_published(engine), timeout_s=15, what="rows published after the partition")
    delivered = amqp.take_all(api_queue)

    assert sorted(message.event_id for message in delivered) == sorted(row.event_id for row in outbox_rows(engine)[1:])
    assert sequences(delivered) == {pipeline: [1, 2, 3, 4] for pipeline in pipelines}


class _ConfirmsCancelledOnce(publisher.Publisher):
    """A publisher whose first publish has its confirm cancelled, as when its connection dies.

    It meets what aiormq does to the confirms it awaits when its connection dies: they are rejected with a
    CancelledError, which is no stop of the relay.
    """

    cancelled = 0

    async def channel(self) -> Any:
        channel = await super().channel()
        publisher_ = self

        class Channel:
            async def basic_publish(self, *args: Any, **options: Any) -> Any:
                if publisher_.cancelled == 0:
                    publisher_.cancelled += 1
                    raise asyncio.CancelledError()
                return await channel.basic_publish(*args, **options)

            def __getattr__(self, name: str) -> Any:
                return getattr(channel, name)

        return Channel()


def test_a_publish_cancelled_under_the_relay_only_makes_its_row_wait(installation, engines, amqp, relay_config):
    engine = engines["lyric"]
    config = relay_config(sources={"lyric": installation.database_urls["lyric"]}, fallback_poll_s=30)
    loop = LoopThread()
    cancelling = _ConfirmsCancelledOnce(
        config.amqp_url, installation.topology.exchange, config.confirm_timeout_s, config.max_message_bytes
    )
    try:
        task = loop.submit(
            relay.SourceRelay("lyric", config.sources["lyric"], cancelling, config, "unused.dead-letter").run_forever()
        )
        [row] = write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
        waits.until(lambda: all_published(engine), what="the row published after all")
        assert cancelling.cancelled == 1 and not task.done()
        assert [message.event_id for message in amqp.take_all(installation.topology.queue("api"))] == [row.id]
    finally:
        loop.submit(cancelling.close()).result(timeout=5)
        loop.close()


def test_a_second_relay_on_the_same_source_stands_by_until_the_leader_goes(installation, engines, amqp, relay_config):
    """Two relays drain one database.

    Only the lease's holder publishes, so no row goes out twice; a leader that stops gives its lease up, and the
    standby takes over at its next look.
    """
    engine = engines["lyric"]
    api_queue = installation.topology.queue("api")
    config = relay_config(sources={"lyric": installation.database_urls["lyric"]}, fallback_poll_s=30)
    with replicas(config, installation.topology.exchange) as (loops, relays):
        tasks = [loop.submit(each.run_forever()) for loop, each in zip(loops, relays, strict=True)]
        write_events(engine, interleaved([str(uuid.uuid4()) for _ in range(3)], 10, seed=3), STARTED)
        waits.until(lambda: all_published(engine), what="30 rows published")
        waits.until(lambda: sorted(each.published for each in relays) == [0, 30], what="all 30 by one relay")
        assert len({message.event_id for message in amqp.take_all(api_queue)}) == 30

        leader = next(i for i, each in enumerate(relays) if each.published)
        term = lease_row(engine).term
        tasks[leader].cancel()
        stopped = time.monotonic()
        waits.until(lambda: relays[1 - leader].lease.held(), timeout_s=5, what="the standby leading")
        assert time.monotonic() - stopped < config.lease_s  # the lease was given up, not left to run out
        assert lease_row(engine).term == term + 1
        write_events(engine, [lyric_started(str(uuid.uuid4()), n) for n in range(1, 6)], STARTED)
        waits.until(lambda: all_published(engine), what="rows published by the standby")
        waits.until(lambda: [relays[leader].published, relays[1 - leader].published] == [30, 5], what="counts")
        assert len(amqp.take_all(api_queue)) == 5


def leaders(engines: Mapping[str, sa.Engine]) -> Counter[str]:
    """How many of the source databases each relay leads (by their live lease rows)."""
    led: Counter[str] = Counter()
    for engine in engines.values():
        with engine.connect() as conn:
            holder = conn.execute(sa.text("SELECT holder FROM outbox_leader WHERE expires_at > now()")).scalar()
        if holder is not None:
            led[holder] += 1
    return led


class Writes:
    """Rows written into every source database in rounds, and what the queues must have got from them."""

    # Each stage's database: its stage, and the type of the rows written there.
    STAGES = {stage.value: (stage, events.stage_event(stage, "started")) for stage in events.Stage}

    def __init__(self, engines: Mapping[str, sa.Engine]) -> None:
        self.engines = engines
        self.pipelines = {service: str(uuid.uuid4()) for service in self.STAGES}  # one per stage's database
        self.written = dict.fromkeys(self.STAGES, 0)
        self.ids: set[uuid.UUID] = set()

    def round(self, per_database: int) -> None:
        """`per_database` more rows in each database: the next attempts of its pipeline, requests in the api's."""
        for service, (stage, event_type) in self.STAGES.items():
            attempts = range(self.written[service] + 1, self.written[service] + 1 + per_database)
            payloads = [lyric_started(self.pipelines[service], n, stage) for n in attempts]
            self.ids |= {row.id for row in write_events(self.engines[service], payloads, event_type)}
            self.written[service] += per_database
        requests = [pipeline_requested() for _ in range(per_database)]
        self.ids |= {row.id for row in write_events(self.engines["api"], requests, events.PIPELINE_REQUESTED)}

    def published(self) -> bool:
        return all(all_published(engine) for engine in self.engines.values())

    def check(self, amqp: Any, topology: Any) -> list[tuple[str, int | None]]:
        """Assert that every row reached its queue, each pipeline's in order; those that came twice."""
        waits.until(self.published, what="every row published")
        delivered = amqp.take_all(topology.queue("api")) + amqp.take_all(topology.queue("lyric"))
        first: dict[uuid.UUID, Delivered] = {}
        for message in delivered:
            first.setdefault(message.event_id, message)
        assert set(first) == self.ids
        stage_facts = (message for message in first.values() if message.routing_key != events.PIPELINE_REQUESTED)
        expected = {self.pipelines[service]: list(range(1, self.written[service] + 1)) for service in self.STAGES}
        assert sequences(stage_facts) == expected
        twice = [message for message in delivered if first[message.event_id] is not message]
        return [(message.routing_key, message.document["data"].get("attempt")) for message in twice]


def test_two_relays_share_four_outboxes_take_over_a_frozen_ones_and_share_again(
    installation, engines, amqp, start_relay
):
    """Four source databases: a lone relay leads all four; a second one starts, and the first hands two
    leases over, one at a time, so each leads two. One freezes (a paused machine): the other leads all four
    within the lease and a look, and publishes on. Woken, the frozen one is fenced, counted live again, and
    the leases spread two and two again; when one stops, the other leads all four at once. Every row
    arrives, each pipeline's in order."""
    lease_s = 2.0
    within_s = 2 * lease_s + 4 * leadership.LOOK_S  # two hand-backs, a lease_s apart, each taken at a look
    writes = Writes(engines)
    writes.round(5)
    first = start_relay(lease_s=lease_s, fallback_poll_s=0.5)
    [alone] = waits.until(lambda: list(leaders(engines).values()) == [4] and list(leaders(engines)), what="all 4")

    started = time.monotonic()
    second = start_relay(lease_s=lease_s, fallback_poll_s=0.5)
    writes.round(5)
    spread = waits.until(lambda: sorted(leaders(engines).values()) == [2, 2] and leaders(engines), timeout_s=20)
    spread_s = time.monotonic() - started
    assert spread_s < lease_s + within_s, spread_s  # it counts the new relay live within a renewal
    writes.round(5)
    waits.until(writes.published, what="the rows published before the freeze")

    frozen_at = time.monotonic()
    first.freeze(10)
    [survivor] = waits.until(lambda: list(leaders(engines).values()) == [4] and list(leaders(engines)), timeout_s=10)
    taken_over_s = time.monotonic() - frozen_at
    assert taken_over_s < lease_s + leadership.LOOK_S + 0.5, taken_over_s  # 0.5 s: this test's looks
    assert survivor != alone  # the first one froze: the second took its leases over
    writes.round(5)

    time.sleep(max(0.0, 10 - (time.monotonic() - frozen_at)))  # the frozen relay wakes
    woken_at = time.monotonic()
    again = waits.until(lambda: sorted(leaders(engines).values()) == [2, 2] and leaders(engines), timeout_s=20)
    spread_again_s = time.monotonic() - woken_at
    assert set(again) == set(spread) == {alone, survivor}
    assert spread_again_s < lease_s + within_s, spread_again_s
    writes.round(5)
    waits.until(writes.published, what="the rows published before the stop")  # a stop mid-batch sends some twice

    stopped_at = time.monotonic()
    second.stop()  # it gives its leases up and leaves the live relays: the first one's share is all four
    waits.until(lambda: leaders(engines) == {alone: 4}, timeout_s=10, what="the first relay leading all 4")
    alone_again_s = time.monotonic() - stopped_at
    assert alone_again_s < 2 * leadership.LOOK_S, alone_again_s
    writes.round(5)

    # Every row, each pipeline's in order; a row in flight when its lease was handed back may come twice (the
    # relay's promise is at least once: inboxes drop the second), which is logged, not failed.
    twice = writes.check(amqp, installation.topology)
    logging.getLogger(__name__).info(
        "spread in %.1f s, taken over in %.1f s, spread again in %.1f s, alone again in %.1f s; sent twice: %s",
        spread_s,
        taken_over_s,
        spread_again_s,
        alone_again_s,
        twice,
    )


def test_a_standby_relay_does_not_listen_until_it_leads(installation, engines, relay_config):
    """Only the leader relay listens; a standby starts listening when it takes over.

    A standby that LISTENed would never read its notifications and so hold back PostgreSQL's notification queue,
    shared by the whole server, until every NOTIFY fails. The standby misses no row committed before it takes over.
    """
    engine = engines["lyric"]
    config = relay_config(sources={"lyric": installation.database_urls["lyric"]}, fallback_poll_s=30)
    with replicas(config, installation.topology.exchange) as (loops, relays):
        tasks = [loop.submit(each.run_forever()) for loop, each in zip(loops, relays, strict=True)]
        write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
        waits.until(lambda: all_published(engine), what="a row published: the leader is past its LISTEN")
        waits.until(lambda: sum(each.lease.term is None for each in relays) == 1, what="the standby looking")
        assert sessions(engine, LISTENING) == 1

        leader = next(i for i, each in enumerate(relays) if each.published)
        tasks[leader].cancel()
        waits.until(lambda: relays[1 - leader].lease.held(), what="the standby taking the lease")
        write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
        waits.until(lambda: relays[1 - leader].published == 1, what="the row published by the new leader")
        waits.until(lambda: sessions(engine, LISTENING) == 1, what="the new leader listening, the old one gone")
        write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
        waits.until(lambda: relays[1 - leader].published == 2, timeout_s=5, what="a row published on NOTIFY")


def test_a_frozen_leader_is_replaced_within_its_lease_and_publishes_nothing_when_it_wakes(
    installation, engines, amqp, relay_config
):
    """A frozen leader is replaced within its lease, and publishes nothing when it wakes.

    A leader whose process stops running (a paused machine, SIGSTOP; here its event loop blocked) keeps its
    connections open but renews nothing: the standby takes over once the lease ran out, and publishes what is
    written meanwhile. The old leader, woken, knows by its own clock that its lease is gone and sends nothing more:
    every row reaches the queue once.
    """
    engine = engines["lyric"]
    api_queue = installation.topology.queue("api")
    config = relay_config(sources={"lyric": installation.database_urls["lyric"]}, fallback_poll_s=0.5, lease_s=2)
    with replicas(config, installation.topology.exchange) as (loops, relays):
        leader = started_with_a_leader(loops, relays, engine)
        term = lease_row(engine).term

        frozen_at = time.monotonic()
        loops[leader].call(lambda: time.sleep(8))  # the leader's whole process stops for 8 s
        write_events(engine, [lyric_started(str(uuid.uuid4()), n) for n in range(1, 11)], STARTED)
        waits.until(lambda: relays[1 - leader].published == 10, timeout_s=8, what="the rows published by the standby")
        taken_over_s = time.monotonic() - frozen_at
        assert taken_over_s < config.lease_s + 2 * leadership.LOOK_S, taken_over_s
        assert lease_row(engine).term == term + 1

        time.sleep(max(0.0, 8 - (time.monotonic() - frozen_at)) + 1)  # the old leader is awake again
        write_events(engine, [lyric_started(str(uuid.uuid4()), n) for n in range(1, 6)], STARTED)
        waits.until(lambda: all_published(engine), what="rows written after the wake-up published")
        assert relays[leader].published == 1 and not relays[leader].lease.held()
        delivered = [message.event_id for message in amqp.take_all(api_queue)]
        assert len(delivered) == len(set(delivered)) == 16


def test_a_leader_that_lost_its_connections_leads_on_under_its_term(installation, engines, amqp, relay_config):
    """A leader whose sessions the server ended connects again and leads on under the same term.

    An outage of a moment, a failover: it renews its own lease before it runs out, and no other relay took over.
    """
    engine = engines["lyric"]
    config = relay_config(sources={"lyric": installation.database_urls["lyric"]}, fallback_poll_s=0.5, lease_s=6)
    with replicas(config, installation.topology.exchange) as (loops, relays):
        leader = started_with_a_leader(loops, relays, engine)
        term, holder, _ = lease_row(engine)

        with engine.connect() as conn:
            ended = conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    f" WHERE datname = current_database() AND {LISTENING}"
                )
            ).scalar_one()
        assert ended == 1
        write_events(engine, [lyric_started(str(uuid.uuid4()), 2)], STARTED)
        waits.until(lambda: all_published(engine), what="the next row published")
        # The relay counts a row once its mark is committed: a moment after the row shows published.
        waits.until(lambda: relays[leader].published == 2, what="the leader counting the row it published")
        assert relays[1 - leader].published == 0
        assert tuple(lease_row(engine)) == (term, holder, True)


def test_an_unexpected_error_is_logged_with_its_traceback_and_the_relay_carries_on(
    installation, engines, start_relay, monkeypatch, caplog
):
    """An error that is neither the database's nor the broker's (a bug) does not end the source's relay.

    It is logged with the traceback, and the relay starts over after retry_delay_s and publishes.
    """
    pending = relay.SourceRelay._pending
    failures: list[RuntimeError] = []

    async def fails_once(self: relay.SourceRelay, conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
        if not failures:
            failures.append(RuntimeError("a bug in the drain"))
            raise failures[0]
        return await pending(self, conn)

    monkeypatch.setattr(relay.SourceRelay, "_pending", fails_once)
    engine = engines["lyric"]
    write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
    start_relay(sources={"lyric": installation.database_urls["lyric"]}, fallback_poll_s=30)

    waits.until(lambda: all_published(engine), what="the row published after the error")
    [logged] = [record for record in caplog.records if record.name == relay.log.name and record.exc_info]
    assert logged.levelno == logging.ERROR
    assert logged.exc_info is not None and logged.exc_info[1] is failures[0]


def test_a_database_not_migrated_to_the_relays_version_is_named_as_such_not_as_an_outage(
    installation, engines, start_relay, caplog
):
    """A relay upgraded before the service whose outbox it drains finds no lease table.

    It says what to do, as an error, and keeps trying; once the database is migrated it leads and publishes.
    """
    engine = engines["lyric"]
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE outbox_leader RENAME TO outbox_leader_later"))
    write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
    start_relay(sources=(installation.database_urls["lyric"],), fallback_poll_s=30)

    waits.until(
        lambda: any("migrate the service's database" in r.getMessage() for r in caplog.records if r.levelno >= 40),
        what="an error line saying what to do",
    )
    assert not all_published(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE outbox_leader_later RENAME TO outbox_leader"))
    waits.until(lambda: all_published(engine), what="the row published once the table is there")
