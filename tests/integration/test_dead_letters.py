"""Messages a service cannot read or handle are dead-lettered, and its consumer goes on.

They are parked in the dead-letter queue with the reason, and the consumer (a real Dramatiq worker on the service's
queue) goes on with the next one; each is counted by why (castad_consumer_dead_letters_total). A consumer files a
dead letter by rejecting it on its own queue: the broker's `x-death` names the queue, which is how the gateway
records where it came from (`describe`, the recorder's reading of a message of the dead-letter queue).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from castad_api import dead_letter_rows, dead_letters
from castad_api import settings as api_settings
from castad_contracts import events
from castad_contracts import topology as contracts_topology
from castad_runtime import db, metrics, tables
from prometheus_client import CollectorRegistry

from tests.integration.gateway import Projection
from tests.integration.helpers import (
    Counted,
    Delivered,
    count,
    now,
    requested_envelope,
    stage_trigger_handler,
)
from tests.support import waits

pytestmark = pytest.mark.integration


def test_unreadable_and_unhandled_messages_are_dead_lettered_and_the_next_good_one_is_handled(
    installation, engines, amqp, run_consumer
):
    """Seven bad messages on the lyric queue, then a good one.

    Each bad one lands in <ns>.dead-letter with its body and an x-castad-reason naming what is wrong; none blocks,
    crashes or is retried, and the good pipeline.requested still creates its job.
    """
    topology = installation.topology
    handler = Counted(stage_trigger_handler(engines["lyric"]))
    registry = metrics.registry()
    measured = metrics.ConsumerMetrics(registry, "lyric")
    run_consumer("lyric", {events.PIPELINE_REQUESTED: handler}, threads=1, metrics=measured)
    unknown = requested_envelope().model_copy(update={"type": "pipeline.exploded"})
    unreadable = requested_envelope().model_copy(update={"data": {"pipeline_id": "p-1", "brief": {}}})
    routed_as_another = requested_envelope().model_copy(update={"type": "video.completed", "source": "/castad/video"})
    bad = {
        b"\x00\xffnot json at all{": "not JSON",
        b"[1, 2, 3]": "not a JSON object",
        json.dumps({"specversion": "1.0", "type": "pipeline.requested"}).encode(): "invalid envelope",
        unknown.to_json(): "no handler for 'pipeline.exploded' in lyric",
        unreadable.to_json(): "unreadable pipeline.requested payload",
        json.dumps({"actor_name": "x", "queue_name": "q", "args": 5, "message_id": "m"}).encode(): (
            "invalid Dramatiq message"
        ),
        routed_as_another.to_json(): "a video.completed delivered under routing key 'pipeline.requested'",
    }
    good = requested_envelope()

    for body in bad:
        if body == unknown.to_json():  # no queue takes an unknown type but as a replay, sent to the queue alone
            queue = topology.queue("lyric")
            amqp.publish(contracts_topology.Topology.requeue_exchange(queue), queue, body)
        else:
            amqp.publish(topology.exchange, events.PIPELINE_REQUESTED, body)
    amqp.publish(topology.exchange, events.PIPELINE_REQUESTED, good.to_json(), message_id=str(good.id))

    waits.until(lambda: handler.finished == 1, what="the good message handled")
    dead = [recorded(message) for message in amqp.take(topology.dead_letter_queue, len(bad))]

    reasons = {row["reason"]: row for row in dead}
    for body, reason in bad.items():
        [parked] = [row for text, row in reasons.items() if text.startswith(reason)]
        assert _same_document(parked["body"], body), reason
        assert (parked["kind"], parked["service"], parked["queue"]) == ("message", "lyric", topology.queue("lyric"))
    assert "brief" in next(text for text in reasons if text.startswith("unreadable"))
    assert count(engines["lyric"], tables.jobs) == 1
    assert count(engines["lyric"], tables.jobs, tables.jobs.c.pipeline_id == good.subject) == 1
    for queue in (topology.queue("lyric"), topology.dead_letter_queue):
        assert amqp.depth(queue) == 0, queue
    kinds = {metrics.UNDECODABLE: 5, metrics.UNKNOWN_TYPE: 1, metrics.INVALID_PAYLOAD: 1}
    waits.until(lambda: {kind: _dead_letters(registry, kind) for kind in kinds} == kinds, what=f"counted: {kinds}")
    assert _handoffs(registry) == 1  # only the good one reached a handler


def test_a_message_its_handler_keeps_failing_on_is_dead_lettered_after_the_last_retry(installation, amqp, run_consumer):
    """A handler that always raises.

    Dramatiq retries the message with backoff, and after the last retry it lands in <ns>.dead-letter with the error
    as its reason (Dramatiq's .XQ, where it would expire unexplained, is not even declared); the queue goes on with
    the next message.
    """
    topology = installation.topology
    calls: list[str] = []

    def failing(env, payload):
        calls.append(payload.pipeline_id)
        if payload.pipeline_id == doomed.subject:
            raise RuntimeError("the stage database refuses this pipeline")

    registry = metrics.registry()
    measured = metrics.ConsumerMetrics(registry, "lyric")
    run_consumer("lyric", {events.PIPELINE_REQUESTED: failing}, threads=1, max_retries=2, metrics=measured)
    doomed, good = requested_envelope(), requested_envelope()
    amqp.publish(topology.exchange, events.PIPELINE_REQUESTED, doomed.to_json(), message_id=str(doomed.id))
    amqp.publish(topology.exchange, events.PIPELINE_REQUESTED, good.to_json(), message_id=str(good.id))

    [parked] = [recorded(message) for message in amqp.take(topology.dead_letter_queue, 1, timeout=30)]

    assert json.loads(parked["body"]) == json.loads(doomed.to_json())
    assert parked["reason"] == (
        "pipeline.requested handler failed 3 times, last: RuntimeError: the stage database refuses this pipeline"
    )
    assert calls.count(doomed.subject) == 3 and calls.count(good.subject) == 1
    for queue in (topology.queue("lyric"), topology.dead_letter_queue):
        assert amqp.depth(queue) == 0, queue
    waits.until(lambda: _dead_letters(registry, metrics.HANDLER_FAILED) == 1, what="counted as handler_failed")
    assert _handoffs(registry) == 2  # the doomed one's retries waited in the delay queue: no handoff


def test_a_bad_message_on_the_delay_queue_is_dead_lettered_and_acknowledged_there(installation, amqp, run_consumer):
    """What Dramatiq cannot run from the delay queue is dead-lettered and acknowledged there.

    Only Dramatiq writes to <queue>.DQ (retries waiting for their time), but what it cannot run from there is
    dead-lettered too, and acknowledged on the delay queue: once the worker has stopped, nothing comes back to it.
    """
    topology = installation.topology
    delay_queue = topology.queue("lyric") + ".DQ"
    run_consumer("lyric", {}, threads=1)
    bad = {
        "queue_name": delay_queue,
        "actor_name": "lyric.on_event",
        "args": [],
        "kwargs": {},
        "options": {},
        "message_id": "m-1",
        "message_timestamp": 0,
    }
    amqp.publish("", delay_queue, json.dumps(bad).encode())

    [parked] = [recorded(message) for message in amqp.take(topology.dead_letter_queue, 1)]
    run_consumer.stop()

    assert parked["reason"] == "a Dramatiq message with bad arguments for lyric.on_event"
    assert json.loads(parked["body"]) == bad
    assert parked["queue"] == topology.queue("lyric")  # a delay queue's letter is its service queue's
    for queue in (topology.queue("lyric"), delay_queue):
        assert amqp.depth(queue) == 0, queue


def recorded(message: Delivered) -> dict[str, Any]:
    """The gateway's row of a message of the dead-letter queue."""
    return dead_letter_rows.describe(message.properties.message_id, message.headers, message.body, body_max=1 << 20)


def _same_document(parked: bytes, published: bytes) -> bool:
    """Raw bytes are parked as they came; a parsed envelope is parked as the same JSON document."""
    if parked == published:
        return True
    try:
        return json.loads(parked) == json.loads(published)
    except ValueError:
        return False


def _dead_letters(registry: CollectorRegistry, reason: str) -> float:
    labels = {"service": "lyric", "reason": reason}
    return registry.get_sample_value("castad_consumer_dead_letters_total", labels) or 0.0


def _handoffs(registry: CollectorRegistry) -> float:
    labels = {"service": "lyric", "event_type": events.PIPELINE_REQUESTED}
    return registry.get_sample_value("castad_handoff_seconds_count", labels) or 0.0


def test_a_message_that_kills_its_consumer_every_time_is_dead_lettered_after_the_delivery_limit(installation, amqp):
    """A message whose consumers keep dying is dead-lettered after DELIVERY_LIMIT returns.

    Its consumers die before acknowledging it (here: each closes its channel with the message unacknowledged, as a
    killed process's connection would); it comes back DELIVERY_LIMIT times, then its quorum queue puts it into
    <ns>.dead-letter with the broker's reason, instead of killing consumers for ever.
    """
    topology = installation.topology
    queue = topology.queue("lyric")
    poison = requested_envelope()
    amqp.publish(topology.exchange, events.PIPELINE_REQUESTED, poison.to_json(), message_id=str(poison.id))

    connection = pika.BlockingConnection(pika.URLParameters(installation.amqp_url))
    deliveries = 0
    try:
        while deliveries <= contracts_topology.DELIVERY_LIMIT + 1:
            channel = connection.channel()
            method, _, _ = channel.basic_get(queue)
            channel.close()  # the consumer "dies" holding it: back in the queue, one delivery more
            if method is None:
                break
            deliveries += 1
    finally:
        connection.close()
    [dead] = amqp.take(topology.dead_letter_queue, 1)

    assert deliveries == contracts_topology.DELIVERY_LIMIT + 1
    assert json.loads(dead.body) == json.loads(poison.to_json())
    row = dead_letter_rows.describe(dead.properties.message_id, dead.headers, dead.body, body_max=1 << 20)
    assert (row["service"], row["queue"], row["event_id"]) == ("lyric", queue, poison.id)
    assert "never acknowledged" in row["reason"]
    assert amqp.depth(queue) == 0


def test_an_event_from_another_service_than_its_types_producer_is_dead_lettered_and_never_handled(
    installation, engines, amqp, run_consumer
):
    """A pipeline.requested that says it comes from the song stage (only the gateway produces it).

    Dead-lettered at once with a reason naming both, counted as wrong_source, its handler never called; a genuine
    one after it is handled.
    """
    topology = installation.topology
    handler = Counted(stage_trigger_handler(engines["lyric"]))
    registry = metrics.registry()
    run_consumer(
        "lyric", {events.PIPELINE_REQUESTED: handler}, threads=1, metrics=metrics.ConsumerMetrics(registry, "lyric")
    )
    forged = requested_envelope().model_copy(update={"source": "/castad/song"})
    good = requested_envelope()
    for env in (forged, good):
        amqp.publish(topology.exchange, events.PIPELINE_REQUESTED, env.to_json(), message_id=str(env.id))

    [dead] = amqp.take(topology.dead_letter_queue, 1)
    waits.until(lambda: handler.finished >= 1, what="the genuine one handled")

    row = recorded(dead)
    assert row["event_id"] == forged.id and row["queue"] == topology.queue("lyric")
    assert "pipeline.requested from /castad/song: only /castad/api produces it" in row["reason"]
    assert handler.finished == 1
    assert count(engines["lyric"], tables.jobs, tables.jobs.c.pipeline_id == forged.subject) == 0
    assert count(engines["lyric"], tables.jobs, tables.jobs.c.pipeline_id == good.subject) == 1
    waits.until(lambda: _dead_letters(registry, metrics.WRONG_SOURCE) == 1, what="counted as wrong_source")


def test_a_dead_letter_is_replayed_only_into_the_queue_it_died_in_whatever_it_claims(installation, engines, amqp):
    """A dead letter claiming to be another queue's is recorded and replayed as its own queue's.

    A message in lyric's queue claims, in every header it can set, to be song's dead letter (its queue, its
    service, an `x-death` of its own): rejected there, it is recorded as lyric's, and its replay goes to lyric's
    queue alone, where it came from.
    """
    topology = installation.topology
    event = Projection(engines["api"]).envelope(str(uuid.uuid4()), events.Stage.LYRIC, "completed", 1, now())
    claims = {
        "x-castad-queue": topology.queue("song"),
        "x-castad-service": "song",
        "x-death": [{"count": 1, "reason": "rejected", "queue": topology.queue("song"), "exchange": ""}],
    }
    properties = pika.BasicProperties(delivery_mode=2, message_id=str(uuid.uuid4()), headers=claims)
    amqp.channel.basic_publish(
        topology.requeue_exchange(topology.queue("lyric")), topology.queue("lyric"), event.to_json(), properties
    )
    method, _, _ = amqp.channel.basic_get(topology.queue("lyric"))
    amqp.channel.basic_reject(method.delivery_tag, requeue=False)
    [dead] = amqp.take(topology.dead_letter_queue, 1)

    policy = api_settings.ApiSettings(database_url=installation.database_urls["api"]).retention_policy()
    with db.transaction(engines["api"]) as conn:
        letter_id = dead_letters.record(conn, recorded(dead))
        assert letter_id is not None
        detail = dead_letters.replay(conn, letter_id, "ops", policy)
    with engines["api"].connect() as conn:
        [destination] = conn.execute(sa.select(tables.outbox.c.destination)).scalars()

    assert destination == topology.queue("lyric") and topology.queue("lyric") in detail
