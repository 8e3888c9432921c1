"""An installation whose queues an earlier version declared as classic queues.

Its services refuse to start with one line, `castad-admin topology` says so, and `castad-admin move-to-quorum`
moves every queue to a quorum queue with every message that waited in it, in order.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pika
import pytest
from castad_contracts import events, topology
from castad_local import admin, quorum
from castad_runtime import messaging
from dramatiq.brokers.rabbitmq import RabbitmqBroker, dq_name, xq_name
from typer.testing import CliRunner

from tests.integration.helpers import Amqp, requested_envelope
from tests.support.servers import AMQP_URL

pytestmark = pytest.mark.integration


def declare_as_an_earlier_version_did(topo: topology.Topology) -> None:
    """The topology of the version before quorum queues.

    Dramatiq's classic queues (with .DQ and .XQ), a classic dead-letter queue, the same exchanges and bindings.
    """
    broker = RabbitmqBroker(url=AMQP_URL)
    try:
        for service in topo.services:
            broker.declare_queue(topo.queue(service), ensure=True)
        channel = broker.channel
        channel.exchange_declare(topo.exchange, exchange_type="topic", durable=True)
        channel.exchange_declare(topo.dead_letter_exchange, exchange_type="fanout", durable=True)
        channel.queue_declare(topo.dead_letter_queue, durable=True)
        channel.queue_bind(topo.dead_letter_queue, topo.dead_letter_exchange)
        for service in topo.services:
            for key in topo.bindings(service):
                channel.queue_bind(topo.queue(service), topo.exchange, routing_key=key)
    finally:
        broker.close()


@pytest.fixture
def earlier() -> Iterator[topology.Topology]:
    topo = topology.Topology(f"test-move-{uuid.uuid4().hex[:8]}")
    declare_as_an_earlier_version_did(topo)
    try:
        yield topo
    finally:
        messaging.delete_topology(AMQP_URL, topo)
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        try:
            for queue in messaging.queue_names(topo):
                connection.channel().queue_delete(queue + quorum.HOLDING)
        finally:
            connection.close()


def test_a_service_refuses_to_start_on_a_classic_queue_and_says_what_to_do(earlier):
    with pytest.raises(messaging.TopologyMismatch) as refused:
        messaging.declare_own(AMQP_URL, earlier, "lyric")

    assert str(refused.value) == (
        f"queue {earlier.queue('lyric')} is a classic queue, this version needs a quorum queue: stop every service"
        " and run `castad-admin move-to-quorum` (docs/deploy.md)"
    )
    assert {state.kind for state in messaging.queue_states(AMQP_URL, earlier)} == {messaging.CLASSIC}


def test_the_topology_command_refuses_a_classic_queue_in_one_line(earlier):
    done = CliRunner().invoke(
        admin.app, ["topology", "--namespace", earlier.namespace], env={"CASTAD_AMQP_URL": AMQP_URL}
    )

    assert done.exit_code == 1
    [line] = done.output.strip().splitlines()
    assert "is a classic queue" in line and "move-to-quorum" in line


def test_moving_to_quorum_keeps_every_waiting_message_in_order_and_retires_dramatiqs_xq(earlier):
    amqp = Amqp(AMQP_URL)
    try:
        requested = [requested_envelope() for _ in range(5)]
        for env in requested:
            amqp.publish(earlier.exchange, events.PIPELINE_REQUESTED, env.to_json(), message_id=str(env.id))
        delayed = {"queue_name": dq_name(earlier.queue("song")), "actor_name": "song.on_event", "message_id": "d-1"}
        amqp.publish("", dq_name(earlier.queue("song")), json.dumps(delayed).encode(), message_id="d-1")
        amqp.publish("", xq_name(earlier.queue("video")), b'{"failed": "long ago"}', message_id="x-1")
        amqp.publish(earlier.dead_letter_exchange, "", b'{"dead": "already"}', message_id="dl-1")

        done = CliRunner().invoke(
            admin.app, ["move-to-quorum", "--namespace", earlier.namespace], env={"CASTAD_AMQP_URL": AMQP_URL}
        )

        assert done.exit_code == 0, done.output
        states = messaging.queue_states(AMQP_URL, earlier)
        assert {state.name: state.kind for state in states} == dict.fromkeys(
            messaging.queue_names(earlier), messaging.QUORUM
        )
        moved = amqp.take_all(earlier.queue("lyric"))
        assert [message.event_id for message in moved] == [env.id for env in requested]
        assert [message.properties.message_id for message in moved] == [str(env.id) for env in requested]
        [waiting] = amqp.take_all(dq_name(earlier.queue("song")))
        assert json.loads(waiting.body) == delayed
        dead = {message.properties.message_id: message for message in amqp.take_all(earlier.dead_letter_queue)}
        assert set(dead) == {"x-1", "dl-1"}
        assert dead["x-1"].headers["x-castad-queue"] == earlier.queue("video")
        assert "earlier version" in dead["x-1"].headers["x-castad-reason"]
        # Bindings came back with the queues: a new event reaches its consumer's quorum queue.
        again = requested_envelope()
        amqp.publish(earlier.exchange, events.PIPELINE_REQUESTED, again.to_json(), message_id=str(again.id))
        assert [message.event_id for message in amqp.take(earlier.queue("lyric"), 1)] == [again.id]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"):
            amqp.depth(xq_name(earlier.queue("video")))
    finally:
        amqp.close()


def test_moving_refuses_while_a_service_consumes(earlier):
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        channel.basic_consume(earlier.queue("song"), lambda *_: None)
        with pytest.raises(quorum.MoveRefused, match=f"{earlier.queue('song')} has 1 consumer"):
            quorum.move_to_quorum(AMQP_URL, earlier)
    finally:
        connection.close()
    assert messaging.queue_states(AMQP_URL, earlier)[0].kind == messaging.CLASSIC


def test_a_move_stopped_half_way_is_reported_and_finished_by_running_it_again(earlier):
    """A quorum move stopped half way is reported, and running it again finishes it.

    Stopped after the classic queues were emptied and the quorum ones declared, but before the messages went back:
    `castad-admin topology` refuses, naming the holding queue, and a second move puts every message back.
    """
    amqp = Amqp(AMQP_URL)
    try:
        waiting = [requested_envelope() for _ in range(3)]
        for env in waiting:
            amqp.publish(earlier.exchange, events.PIPELINE_REQUESTED, env.to_json(), message_id=str(env.id))
        quorum.empty_classic_queues(AMQP_URL, messaging.queue_states(AMQP_URL, earlier))
        messaging.declare_topology(AMQP_URL, earlier)  # ... and there it stopped

        shown = CliRunner().invoke(
            admin.app, ["topology", "--namespace", earlier.namespace], env={"CASTAD_AMQP_URL": AMQP_URL}
        )
        assert shown.exit_code == 1
        assert f"{earlier.queue('lyric')}.moving holds 3 messages of an interrupted move" in shown.output

        again = CliRunner().invoke(
            admin.app, ["move-to-quorum", "--namespace", earlier.namespace], env={"CASTAD_AMQP_URL": AMQP_URL}
        )
        assert again.exit_code == 0, again.output
        assert [message.event_id for message in amqp.take_all(earlier.queue("lyric"))] == [env.id for env in waiting]
        assert messaging.interrupted_moves(AMQP_URL, earlier) == []
    finally:
        amqp.close()
