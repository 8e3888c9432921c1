"""The outbox relay against real PostgreSQL and RabbitMQ, running in this process.

Rows are written as services write them (outbox.add in a committed transaction) and read
back from the installation's queues with pika. A broker outage is faked with a TCP proxy
between the relay and the shared RabbitMQ, which other tests keep using.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence

import pytest
import sqlalchemy as sa
from castad_contracts import events
from castad_relay import relay

from tests.integration.helpers import (
    Delivered,
    LoopThread,
    OutboxRow,
    all_published,
    broker_address,
    eventually,
    lyric_started,
    outbox_rows,
    pipeline_requested,
    with_port,
    write_events,
)
from tests.integration.tcp_proxy import running_proxy

pytestmark = pytest.mark.integration

STARTED = events.stage_event(events.Stage.LYRIC, "started")  # bound to the gateway's queue


def interleaved(pipelines: Sequence[str], per_pipeline: int, seed: int) -> list[events.StageStarted]:
    """`per_pipeline` events of each pipeline, attempt 1..n in order per pipeline, shuffled across pipelines."""
    rng = random.Random(seed)
    pending = {pipeline: list(range(1, per_pipeline + 1)) for pipeline in pipelines}
    result = []
    while pending:
        pipeline = rng.choice(sorted(pending))
        result.append(lyric_started(pipeline, pending[pipeline].pop(0)))
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


def test_committed_rows_reach_the_bound_queues_as_envelopes(installation, engines, amqp, start_relay):
    """Rows of several source databases are published to the topic exchange, routed by event type,
    each once, as the CloudEvents envelope it was written as; then they are marked published."""
    topology = installation.topology
    start_relay(fallback_poll_s=30)
    pipeline_id = str(uuid.uuid4())
    requested = write_events(engines["api"], [pipeline_requested(pipeline_id)], events.PIPELINE_REQUESTED)
    started = write_events(engines["lyric"], [lyric_started(pipeline_id, 1)], STARTED)
    started += write_events(engines["song"], [lyric_started(pipeline_id, 2)], STARTED)

    for service in ("api", "lyric", "song"):
        eventually(lambda service=service: all_published(engines[service]), what=f"{service} outbox published")
    [to_lyric] = amqp.take(topology.queue("lyric"), 1)
    to_api = amqp.take(topology.queue("api"), 2)

    trace_fields = {"traceparent", "tracestate"}  # the relay's publish span continues the trace
    assert without(to_lyric.document, trace_fields) == without(requested[0].model_dump(mode="json"), trace_fields)
    assert to_lyric.routing_key == events.PIPELINE_REQUESTED
    assert to_lyric.properties.message_id == str(requested[0].id)
    assert to_lyric.properties.delivery_mode == 2
    assert to_lyric.properties.content_type == "application/cloudevents+json"
    assert sorted(message.event_id for message in to_api) == sorted(env.id for env in started)
    assert {message.routing_key for message in to_api} == {STARTED}
    assert outbox_rows(engines["video"]) == []
    assert amqp.take_all(topology.queue("api")) == [] and amqp.take_all(topology.queue("lyric")) == []


def test_order_per_pipeline_holds_across_many_batches(installation, engines, amqp, start_relay):
    """60 rows of 4 interleaved pipelines, in batches of 7, half written before the relay starts:
    every row arrives exactly once and each pipeline's rows arrive in the order they were written."""
    pipelines = [str(uuid.uuid4()) for _ in range(4)]
    payloads = interleaved(pipelines, 15, seed=1)
    write_events(engines["lyric"], payloads[:30], STARTED)
    start_relay(batch_size=7, fallback_poll_s=30)
    write_events(engines["lyric"], payloads[30:], STARTED)

    eventually(lambda: all_published(engines["lyric"]), timeout=15, what="60 rows published")
    delivered = amqp.take_all(installation.topology.queue("api"))

    assert len(delivered) == 60
    assert len({message.event_id for message in delivered}) == 60
    assert sequences(delivered) == {pipeline: list(range(1, 16)) for pipeline in pipelines}


def test_a_notify_wakes_the_relay_long_before_its_fallback_poll(engines, start_relay):
    """With a 30 s fallback poll, each new row is published within a couple of seconds of its commit."""
    engine = engines["lyric"]
    start_relay(fallback_poll_s=30)
    write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
    eventually(lambda: all_published(engine), what="the first row published")  # the relay is past its first drain

    for attempt in (1, 2, 3):
        write_events(engine, [lyric_started(str(uuid.uuid4()), attempt)], STARTED)
        eventually(lambda: all_published(engine), timeout=5, what="a row published on NOTIFY, not on the 30 s poll")


def test_a_row_the_broker_does_not_confirm_stays_unpublished_and_holds_back_its_pipeline_only(
    installation, engines, amqp, start_relay
):
    """A row RabbitMQ cannot route (mandatory publish, no binding) is never marked published, nor is
    any later row of its pipeline; other pipelines flow. Once a queue is bound, the stuck rows are
    marked, in order."""
    engine = engines["api"]
    stuck, free = str(uuid.uuid4()), str(uuid.uuid4())
    [first] = write_events(engine, [lyric_started(stuck, 1)], STARTED)
    [unroutable] = write_events(
        engine, [events.PipelineCancelRequested(pipeline_id=stuck)], events.PIPELINE_CANCEL_REQUESTED
    )
    [after] = write_events(engine, [lyric_started(stuck, 3)], STARTED)
    others = write_events(engine, [lyric_started(free, 1), lyric_started(free, 2)], STARTED)
    start_relay(fallback_poll_s=30)

    eventually(lambda: published(outbox_rows(engine)) == {first.id} | {env.id for env in others}, what="free rows")
    # The relay keeps retrying the stuck pipeline (a retry re-publishes its later rows too); none gets marked.
    api_queue = installation.topology.queue("api")
    eventually(lambda: amqp.depth(api_queue) >= 6, what="several rounds of retries")
    assert published(outbox_rows(engine)) == {first.id} | {env.id for env in others}

    amqp.channel.queue_bind(installation.topology.queue("lyric"), installation.topology.exchange, unroutable.type)
    eventually(lambda: all_published(engine), what="stuck rows published once routable")
    rows = {row.event_id: row for row in outbox_rows(engine)}
    assert rows[first.id].published_at <= rows[unroutable.id].published_at <= rows[after.id].published_at
    [cancel] = amqp.take(installation.topology.queue("lyric"), 1)
    assert cancel.event_id == unroutable.id
    by_pipeline = sequences(amqp.take_all(api_queue))
    assert by_pipeline[free] == [1, 2]
    assert by_pipeline[stuck][0] == 1 and set(by_pipeline[stuck][1:]) == {3}


def test_published_at_is_set_only_once_the_confirm_arrives(installation, engines, amqp, start_relay):
    """With the broker's replies held back, a row already sitting in its queue is still unpublished in
    the outbox; it is marked once the confirm gets through."""
    engine = engines["lyric"]
    api_queue = installation.topology.queue("api")
    with running_proxy(broker_address(installation.amqp_url)) as proxy:
        start_relay(amqp_url=with_port(installation.amqp_url, proxy.port), fallback_poll_s=30, confirm_timeout_s=30)
        write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
        eventually(lambda: all_published(engine), what="a first row over the proxy")
        amqp.take(api_queue, 1)

        proxy.hold()
        [held] = write_events(engine, [lyric_started(str(uuid.uuid4()), 1)], STARTED)
        [in_queue] = amqp.take(api_queue, 1)
        assert in_queue.event_id == held.id
        assert outbox_rows(engine)[-1].published_at is None

        proxy.restore()
        eventually(lambda: all_published(engine), what="the row marked after its confirm")
        assert amqp.take_all(api_queue) == []


def test_a_broker_outage_only_makes_rows_wait(installation, engines, amqp, start_relay):
    """While the broker is unreachable rows stay unpublished and none is lost; once it is back the
    relay resumes by itself (no NOTIFY, no fallback poll) and publishes each row once, in order."""
    api_queue = installation.topology.queue("api")
    pipelines = [str(uuid.uuid4()) for _ in range(3)]
    with running_proxy(broker_address(installation.amqp_url)) as proxy:
        start_relay(amqp_url=with_port(installation.amqp_url, proxy.port), fallback_poll_s=30, confirm_timeout_s=2)
        write_events(engines["lyric"], [lyric_started(pipeline, 1) for pipeline in pipelines], STARTED)
        eventually(lambda: all_published(engines["lyric"]), what="rows before the outage")
        amqp.take(api_queue, 3)

        proxy.cut()
        waiting = interleaved(pipelines, 8, seed=2)
        write_events(engines["lyric"], waiting[:12], STARTED)
        write_events(engines["song"], waiting[12:], STARTED)
        eventually(lambda: proxy.refused >= 3, what="the relay trying to reconnect")
        assert unpublished(engines["lyric"]) == [False] * 3 + [True] * 12
        assert unpublished(engines["song"]) == [True] * 12
        assert amqp.depth(api_queue) == 0

        proxy.restore()
        for service in ("lyric", "song"):
            eventually(lambda service=service: all_published(engines[service]), what=f"{service} rows after")
    delivered = amqp.take_all(api_queue)

    assert sorted(message.event_id for message in delivered) == sorted(
        row.event_id for row in outbox_rows(engines["lyric"])[3:] + outbox_rows(engines["song"])
    )
    lyric_ids = [row.event_id for row in outbox_rows(engines["lyric"])[3:]]
    song_ids = [row.event_id for row in outbox_rows(engines["song"])]
    ids = [message.event_id for message in delivered]
    assert [i for i in ids if i in lyric_ids] == lyric_ids
    assert [i for i in ids if i in song_ids] == song_ids


def test_a_broker_that_stops_answering_only_makes_rows_wait(installation, engines, amqp, start_relay):
    """A network partition: the relay's connection and every new one go silent, nothing is closed. The
    relay gives up on silent connections (after confirm_timeout_s) instead of waiting forever, and
    publishes every row once, in order, when the network heals."""
    engine = engines["lyric"]
    api_queue = installation.topology.queue("api")
    pipelines = [str(uuid.uuid4()) for _ in range(3)]
    with running_proxy(broker_address(installation.amqp_url)) as proxy:
        start_relay(amqp_url=with_port(installation.amqp_url, proxy.port), fallback_poll_s=30, confirm_timeout_s=1)
        write_events(engine, [lyric_started(pipelines[0], 1)], STARTED)
        eventually(lambda: all_published(engine), what="a row before the partition")
        amqp.take(api_queue, 1)

        proxy.blackhole()
        write_events(engine, interleaved(pipelines, 4, seed=4), STARTED)
        eventually(lambda: proxy.swallowed >= 2, what="the relay abandoning silent connections")
        assert unpublished(engine) == [False] + [True] * 12

        proxy.restore()
        eventually(lambda: all_published(engine), timeout=15, what="rows published after the partition")
    delivered = amqp.take_all(api_queue)

    assert [message.event_id for message in delivered] == [row.event_id for row in outbox_rows(engine)[1:]]
    assert sequences(delivered) == {pipeline: [1, 2, 3, 4] for pipeline in pipelines}


def test_a_second_relay_on_the_same_source_stands_by_until_the_leader_goes(installation, engines, amqp, relay_config):
    """Two relays drain one database: only the advisory-lock leader publishes, so no row goes out
    twice; when the leader stops, the standby takes over."""
    engine = engines["lyric"]
    api_queue = installation.topology.queue("api")
    config = relay_config(sources=(installation.database_urls["lyric"],), fallback_poll_s=30)
    loop = LoopThread()
    publishers = [
        relay.Publisher(config.amqp_url, installation.topology.exchange, config.confirm_timeout_s) for _ in range(2)
    ]
    relays = [relay.SourceRelay(config.sources[0], publisher, config) for publisher in publishers]
    try:
        tasks = [loop.submit(each.run_forever()) for each in relays]
        write_events(engine, interleaved([str(uuid.uuid4()) for _ in range(3)], 10, seed=3), STARTED)
        eventually(lambda: all_published(engine), what="30 rows published")
        eventually(lambda: sorted(each.published for each in relays) == [0, 30], what="all 30 by one relay")
        assert len({message.event_id for message in amqp.take_all(api_queue)}) == 30

        leader = next(i for i, each in enumerate(relays) if each.published)
        tasks[leader].cancel()
        write_events(engine, [lyric_started(str(uuid.uuid4()), n) for n in range(1, 6)], STARTED)
        eventually(lambda: all_published(engine), what="rows published by the standby")
        eventually(lambda: [relays[leader].published, relays[1 - leader].published] == [30, 5], what="counts")
        assert len(amqp.take_all(api_queue)) == 5
    finally:
        for publisher in publishers:
            loop.submit(publisher.close()).result(timeout=5)
        loop.close()
