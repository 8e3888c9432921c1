"""Moving an installation's classic queues to quorum queues (`castad-admin move-to-quorum`).

A queue cannot change its type in place. Each classic queue of the topology, as an earlier
version declared it, is emptied into a holding quorum queue (`<queue>.moving`) and deleted;
the topology is then declared anew (quorum queues, their bindings), and each holding queue is
emptied back into its queue, in the order its messages had. Every message is republished with
its properties and confirmed before it is acknowledged where it was: a move that stops half-way
loses nothing (at worst one message comes twice, which inboxes drop) and, run again, goes on
from where it stopped. The earlier version's `.XQ` queues (Dramatiq's) are emptied into the
dead-letter queue, each message with why it is there, and deleted.

It needs every service stopped, the relay too: it refuses while any queue has a consumer, and an
event the relay published meanwhile would find no queue, be refused and tried again later.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pika
import pika.exceptions
from castad_contracts import topology
from castad_runtime import amqp, messaging

HOLDING = messaging.HOLDING_SUFFIX
xq_name = messaging.xq_name  # Dramatiq's dead-letter queue, which versions before quorum queues declared


class MoveRefused(Exception):
    """The queues cannot be moved as they are (a consumer is on one, or one is neither classic nor quorum)."""


def move_to_quorum(amqp_url: str, topo: topology.Topology) -> list[str]:
    """Move every classic queue of the topology to a quorum queue; what was done, a line each."""
    states = messaging.queue_states(amqp_url, topo)
    for state in states:
        if state.consumers:
            raise MoveRefused(f"stop every service first: {state.name} has {state.consumers} consumer(s)")
        if state.kind not in (messaging.QUORUM, messaging.CLASSIC, messaging.MISSING):
            raise MoveRefused(f"{state.name} cannot be moved: {state.kind}")
    done = empty_classic_queues(amqp_url, states)
    messaging.declare_topology(amqp_url, topo)
    return done + retire_xqs(amqp_url, topo) + fill_back(amqp_url, topo)


def empty_classic_queues(amqp_url: str, states: list[messaging.QueueState]) -> list[str]:
    """The first step: each classic queue emptied into its holding quorum queue, then deleted."""
    done = []
    with _connection(amqp_url) as connection:
        for state in states:
            if state.kind == messaging.CLASSIC:
                holding = state.name + HOLDING
                _declare_holding(connection, holding)
                moved = _move_all(connection, state.name, holding)
                connection.channel().queue_delete(state.name, if_empty=True)
                done.append(f"{state.name}: classic queue emptied into {holding} ({moved} messages) and deleted")
    return done


def retire_xqs(amqp_url: str, topo: topology.Topology) -> list[str]:
    """The earlier version's .XQ queues emptied into the dead-letter queue, then deleted."""
    done = []
    with _connection(amqp_url) as connection:
        for service in topo.services:
            retired = _retire_xq(connection, topo, service)
            if retired is not None:
                done.append(
                    f"{xq_name(topo.queue(service))}: {retired} messages into {topo.dead_letter_queue}, deleted"
                )
    return done


def fill_back(amqp_url: str, topo: topology.Topology) -> list[str]:
    """The last step: each holding queue emptied into its (quorum) queue, then deleted."""
    done = []
    with _connection(amqp_url) as connection:
        for queue in messaging.queue_names(topo):
            holding = queue + HOLDING
            if messaging.queue_depth(connection, holding) is not None:
                moved = _move_all(connection, holding, queue)
                _delete_empty_quorum_queue(connection, holding)
                done.append(f"{queue}: quorum queue, {moved} messages moved back")
    return done


@contextlib.contextmanager
def _connection(amqp_url: str) -> Iterator[pika.BlockingConnection]:
    connection = amqp.blocking_connection(amqp_url)
    try:
        yield connection
    finally:
        if connection.is_open:
            connection.close()


def _delete_empty_quorum_queue(connection: pika.BlockingConnection, queue: str) -> None:
    """Delete a quorum queue found empty (quorum queues take no `if_empty` delete; nothing else writes to it)."""
    channel = connection.channel()
    left = channel.queue_declare(queue, passive=True).method.message_count
    if left:
        raise MoveRefused(f"{queue} got {left} messages while it was emptied: stop whatever publishes to it")
    channel.queue_delete(queue)
    channel.close()


def _declare_holding(connection: pika.BlockingConnection, holding: str) -> None:
    connection.channel().queue_declare(holding, durable=True, arguments={"x-queue-type": topology.QUEUE_TYPE})


def _move_all(
    connection: pika.BlockingConnection,
    source: str,
    target: str,
    *,
    exchange: str = "",
    headers: dict[str, str] | None = None,
) -> int:
    """Republish every message of `source` to `target` (a queue, through the default exchange, or `exchange`),
    each acknowledged in `source` once the broker confirmed its copy; how many."""
    channel = connection.channel()
    channel.confirm_delivery()
    moved = 0
    while True:
        method, properties, body = channel.basic_get(source)
        if method is None:
            channel.close()
            return moved
        if headers:
            properties.headers = {**(properties.headers or {}), **headers}
        channel.basic_publish(exchange, target if not exchange else "", body, properties, mandatory=True)
        channel.basic_ack(method.delivery_tag)
        moved += 1


def _retire_xq(connection: pika.BlockingConnection, topo: topology.Topology, service: str) -> int | None:
    """Empty an earlier version's `.XQ` into the dead-letter exchange and delete it; None if there is none."""
    queue = topo.queue(service)
    xq = xq_name(queue)
    if messaging.queue_depth(connection, xq) is None:
        return None
    reason = {
        "x-castad-reason": "failed in an earlier version of Castad, which kept it in Dramatiq's .XQ",
        "x-castad-service": service,
        "x-castad-queue": queue,
    }
    moved = _move_all(connection, xq, "", exchange=topo.dead_letter_exchange, headers=reason)
    connection.channel().queue_delete(xq, if_empty=True)
    return moved
