"""The broker a service consumes with, and the exchange, queues and bindings of a namespace.

Each consuming service has one queue and one actor on it, `<service>.on_event`
(see `consumer.EventConsumer`); `encoder.EnvelopeEncoder` turns the envelopes the relay
publishes into messages for that actor.

Set-up declares the whole topology with an administrator's user (`declare_topology`), or each chart's hook Job
declares its service's part and the shared exchanges with one (`declare_as_administrator`); each service declares
its own part at start with its own, least-privileged user (`declare_own`).
Every queue is a quorum queue (`topology.Topology.queue_arguments`); a queue an earlier version
declared as a classic one cannot change its type in place, so a start that finds one refuses with
`TopologyMismatch` until an operator moved it over (`castad-admin move-to-quorum`, docs/deploy.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pika
import pika.exceptions
from castad_contracts import topology
from dramatiq.brokers.rabbitmq import RabbitmqBroker, _RabbitmqConsumer
from dramatiq.common import dq_name
from dramatiq.common import xq_name as xq_name  # re-exported: set-up moves what Dramatiq once declared
from dramatiq.middleware import CurrentMessage

from castad_runtime import amqp, encoder, outages

log = logging.getLogger(__name__)
DECLARE_TIMEOUT_S = 10.0
PRECONDITION_FAILED = 406


class TopologyMismatch(Exception):
    """A queue exists with other arguments than this version declares (a classic queue of an earlier one)."""


class ServiceBroker(RabbitmqBroker):
    """Dramatiq's RabbitMQ broker with Castad's queues and connections.

    - Its queue and delay queue are quorum queues with the topology's arguments, and it declares no
      `.XQ`: what they dead-letter goes to the namespace's dead-letter exchange, with the broker's
      reason in `x-death`.
    - It connects to the first node of the broker setting that answers (`amqp.pika_parameters`), with
      heartbeats and TCP keepalives.
    - Dramatiq publishes its delayed messages (a handler's retry, a held event) to `<queue>.DQ`
      through the default exchange, which would need a permission to write into every queue.
      This broker's channel sends them through `Topology.requeue_exchange(queue)` instead.
    - Its consumer tells the encoder the routing key of each delivery it decodes (`encoder.delivering`).
    """

    def __init__(self, *, amqp_url: str, topo: topology.Topology, requeue_exchange: str) -> None:
        self.amqp_url = amqp_url
        super().__init__(confirm_delivery=True)
        self.topology = topo
        self.requeue_exchange = requeue_exchange

    @property
    def parameters(self) -> list[pika.URLParameters]:
        """Read by Dramatiq for each connection it makes: the nodes in an order drawn anew each time."""
        return amqp.pika_parameters(self.amqp_url)

    @parameters.setter
    def parameters(self, _: object) -> None:
        """Dramatiq's constructor sets the parameters of a URL it was not given: those here are the setting's."""

    def _build_queue_arguments(self, queue_name: str) -> dict[str, Any]:
        return dict(self.topology.queue_arguments())

    def _declare_xq_queue(self, queue_name: str) -> None:
        """No `.XQ`: see the class docstring."""

    @property
    def consumer_class(self) -> type[_RabbitmqConsumer]:
        return _RoutedConsumer

    @property
    def channel(self) -> Any:
        return _RequeueChannel(RabbitmqBroker.channel.fget(self), self.requeue_exchange)  # type: ignore[attr-defined]

    @channel.deleter
    def channel(self) -> None:
        RabbitmqBroker.channel.fdel(self)  # type: ignore[attr-defined]


class _RoutedConsumer(_RabbitmqConsumer):
    """Dramatiq's consumer, telling the encoder each delivery's routing key.

    Dramatiq decodes a delivery's body as soon as it is taken: the encoder learns its routing key just before.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)  # type: ignore[no-untyped-call]  # Dramatiq's consumer is untyped
        self.iterator = _routed(self.iterator)


def _routed(deliveries: Iterator[tuple[Any, Any, Any]]) -> Iterator[tuple[Any, Any, Any]]:
    for method, properties, body in deliveries:
        encoder.delivering(method.routing_key if method is not None else None)
        yield method, properties, body


FULL_QUEUE_PAUSE_S = 1.0  # before a message its full queue refused goes to the delay queue instead


class _RequeueChannel:
    """A pika channel whose publishes to the default exchange go to one requeue exchange.

    A message its own queue refuses (nacked: the queue is at its length limit, `Topology.limits_policy`; or without
    a majority) goes to the queue's delay queue instead, a moment later: that one has no limit, and its consumer
    handles a message that is due as it would from the queue. Without that, Dramatiq would drop its connection, give
    back every delayed message it holds and count a return against each, until the delivery limit dead-letters them.
    """

    def __init__(self, channel: Any, requeue_exchange: str) -> None:
        self._channel = channel
        self._requeue_exchange = requeue_exchange

    def basic_publish(self, exchange: str, routing_key: str, body: bytes, **options: Any) -> None:
        try:
            self._channel.basic_publish(exchange or self._requeue_exchange, routing_key, body, **options)
        except pika.exceptions.NackError:
            if exchange or routing_key.endswith(".DQ"):  # not to its own queue: as before
                raise
            log.warning("queue %s refuses a message (full): it goes to its delay queue instead", routing_key)
            time.sleep(FULL_QUEUE_PAUSE_S)
            self._channel.basic_publish(self._requeue_exchange, dq_name(routing_key), body, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


def make_broker(amqp_url: str, topo: topology.Topology, service: str) -> RabbitmqBroker:
    """The broker of `service`, consuming its queue."""
    queue = topo.queue(service)
    broker = ServiceBroker(amqp_url=amqp_url, topo=topo, requeue_exchange=topology.Topology.requeue_exchange(queue))
    broker.add_middleware(CurrentMessage())  # lets the event actor read and extend its message's options
    dramatiq.set_broker(broker)
    return broker


def event_actor_name(service: str) -> str:
    return f"{service}.on_event"


def declare_topology(amqp_url: str, topo: topology.Topology) -> None:
    """Declare every exchange, queue (as Dramatiq declares it) and binding of the namespace."""
    _declare(amqp_url, topo, topo.services, shared=True)


def declare_own(amqp_url: str, topo: topology.Topology, service: str) -> None:
    """Declare what `service` owns.

    Its queues, its requeue exchange, its bindings (and, for the gateway, the exchanges and queue every service
    shares). The events exchange must exist first.
    """
    _declare(amqp_url, topo, (service,), shared=service == topology.SHARED_OWNER)


def declare_as_administrator(amqp_url: str, topo: topology.Topology, service: str) -> None:
    """Declare what `service` owns and what every service shares, with a user that may configure the vhost.

    What a chart's hook Job does before the service's new pods start, so that no event waits on the order in which
    services are installed: a service's own user can declare its queues anew only once they exist.
    """
    _declare(amqp_url, topo, (service,) if service in topo.services else (), shared=True)


def _declare(amqp_url: str, topo: topology.Topology, services: tuple[str, ...], shared: bool) -> None:
    # A broker that takes the connection but never answers (a partition) must not hold a start for long.
    connection = amqp.blocking_connection(amqp_url, timeout_s=DECLARE_TIMEOUT_S)
    try:
        if shared:
            arguments = topo.dead_letter_queue_arguments(broker_major(connection))
            _declare_queue(connection, topo, topo.dead_letter_queue, arguments)
        for service in services:
            for queue in (topo.queue(service), dq_name(topo.queue(service))):
                _declare_queue(connection, topo, queue, topo.queue_arguments())
        channel = connection.channel()
        if shared:
            channel.exchange_declare(topo.exchange, exchange_type="topic", durable=True)
            channel.exchange_declare(topo.dead_letter_exchange, exchange_type="fanout", durable=True)
            channel.queue_bind(topo.dead_letter_queue, topo.dead_letter_exchange)
        for service in services:
            queue = topo.queue(service)
            requeue = topo.requeue_exchange(queue)
            channel.exchange_declare(requeue, exchange_type="direct", durable=True)
            for target in (queue, dq_name(queue)):
                channel.queue_bind(target, requeue, routing_key=target)
            for key in topo.bindings(service):
                channel.queue_bind(queue, topo.exchange, routing_key=key)
    finally:
        if connection.is_open:
            connection.close()


def broker_major(connection: pika.BlockingConnection) -> int:
    """The major version the broker announced when the connection opened (RabbitMQ's `version` property)."""
    properties = connection._impl.server_properties or {}  # pika keeps them on the connection it wraps
    version = properties.get("version", b"0")
    text = version.decode() if isinstance(version, bytes) else str(version)
    major = text.split(".", 1)[0]
    return int(major) if major.isdigit() else 0


def _declare_queue(
    connection: pika.BlockingConnection, topo: topology.Topology, queue: str, arguments: dict[str, Any]
) -> None:
    """Declare a durable queue; TopologyMismatch if it exists with other arguments."""
    if _refusal(connection, queue, arguments) is None:
        return
    kind = queue_kind(connection, queue, topo)
    raise TopologyMismatch(
        f"queue {queue} is {'a classic queue' if kind == CLASSIC else kind}, this version needs a quorum queue:"
        " stop every service and run `castad-admin move-to-quorum` (docs/deploy.md)"
    )


@contextlib.contextmanager
def _expected_closes() -> Iterator[None]:
    """Silence pika's warning for the channels a declare that only asks expects the broker to close.

    pika logs a warning for every channel the broker closes; a declare that only asks (is this queue there, is it
    declared so?) expects the broker to close its channel when the answer is no.
    """
    channel_log = logging.getLogger("pika.channel")
    level = channel_log.level
    channel_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        channel_log.setLevel(level)


@dataclasses.dataclass(frozen=True)
class QueueState:
    """What a queue of the topology is on the broker."""

    name: str
    kind: str  # QUORUM, CLASSIC (as an earlier version declared it), MISSING or "other: <the broker's words>"
    messages: int
    consumers: int


HOLDING_SUFFIX = ".moving"  # a queue's holding queue while `castad-admin move-to-quorum` moves it
QUORUM = "quorum"
CLASSIC = "classic"
MISSING = "missing"


def queue_states(amqp_url: str, topo: topology.Topology) -> list[QueueState]:
    """Every queue of the topology as the broker has it (declaring none that is missing)."""
    connection = amqp.blocking_connection(amqp_url, timeout_s=DECLARE_TIMEOUT_S)
    try:
        states = []
        for queue in queue_names(topo):
            found = queue_depth(connection, queue)
            if found is None:
                states.append(QueueState(queue, MISSING, 0, 0))
                continue
            states.append(QueueState(queue, queue_kind(connection, queue, topo), *found))
        return states
    finally:
        if connection.is_open:
            connection.close()


def interrupted_moves(amqp_url: str, topo: topology.Topology) -> list[tuple[str, int]]:
    """Holding queues a `move-to-quorum` left behind (it stopped half-way), with the messages they hold."""
    connection = amqp.blocking_connection(amqp_url, timeout_s=DECLARE_TIMEOUT_S)
    try:
        left = [(name + HOLDING_SUFFIX, queue_depth(connection, name + HOLDING_SUFFIX)) for name in queue_names(topo)]
        return [(name, found[0]) for name, found in left if found is not None]
    finally:
        if connection.is_open:
            connection.close()


def queue_names(topo: topology.Topology) -> list[str]:
    """Every queue of the topology: each service's queue and delay queue, then the dead-letter queue."""
    return [name for service in topo.services for name in (topo.queue(service), dq_name(topo.queue(service)))] + [
        topo.dead_letter_queue
    ]


def queue_depth(connection: pika.BlockingConnection, queue: str) -> tuple[int, int] | None:
    """(messages ready, consumers) of a queue, None if it does not exist."""
    channel = connection.channel()
    try:
        with _expected_closes():
            method = channel.queue_declare(queue, passive=True).method
    except pika.exceptions.ChannelClosedByBroker as error:
        if error.reply_code == 404:
            return None
        raise
    channel.close()
    return method.message_count, method.consumer_count


def queue_kind(connection: pika.BlockingConnection, queue: str, topo: topology.Topology) -> str:
    """Whether an existing queue is as this version declares it, as an earlier version did, or otherwise.

    The earlier version's queues were classic. AMQP tells a queue's arguments only by refusing a declare that
    differs, so each candidate is declared (an equivalent declare changes nothing).
    """
    dead_letters = queue == topo.dead_letter_queue
    ours = topo.dead_letter_queue_arguments(broker_major(connection)) if dead_letters else topo.queue_arguments()
    earlier: dict[str, Any] = (
        {}
        if dead_letters
        else {
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": xq_name(queue),
        }
    )
    refusal = _refusal(connection, queue, ours)
    if refusal is None:
        return QUORUM
    if _refusal(connection, queue, earlier) is None:
        return CLASSIC
    return f"other: {refusal}"


def _refusal(connection: pika.BlockingConnection, queue: str, arguments: dict[str, Any]) -> str | None:
    """The broker's reason to refuse declaring `queue` with `arguments`, None if it takes it."""
    channel = connection.channel()
    try:
        with _expected_closes():
            channel.queue_declare(queue, durable=True, arguments=arguments)
    except pika.exceptions.ChannelClosedByBroker as error:
        if error.reply_code != PRECONDITION_FAILED:
            raise
        return str(error.reply_text).split(" - ", 1)[-1]
    channel.close()
    return None


def declare_own_when_reachable(
    amqp_url: str, topo: topology.Topology, service: str, stop: threading.Event | None = None
) -> None:
    """`declare_own`, tried again until it succeeds.

    A service started during a broker outage (or before the gateway first declared the shared exchanges) waits
    instead of exiting. Raises outages.Stopped if `stop` is set meanwhile.
    """
    outages.keep_trying(
        lambda: declare_own(amqp_url, topo, service), "declaring its queues", stop=stop, first_s=0.5, max_s=10.0
    )


def delete_topology(amqp_url: str, topo: topology.Topology) -> None:
    """Remove every queue and the exchange of a namespace (used by tests)."""
    connection = amqp.blocking_connection(amqp_url)
    try:
        channel = connection.channel()
        for service in topo.services:
            for suffix in ("", ".DQ", ".XQ"):
                channel.queue_delete(topo.queue(service) + suffix)
            channel.exchange_delete(topo.requeue_exchange(topo.queue(service)))
        channel.queue_delete(topo.dead_letter_queue)
        channel.exchange_delete(topo.dead_letter_exchange)
        channel.exchange_delete(topo.exchange)
    finally:
        connection.close()
