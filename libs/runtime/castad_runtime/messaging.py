"""The broker a service consumes with, and the exchange, queues and bindings of a namespace.

Each consuming service has one queue and one actor on it, `<service>.on_event`
(see `consumer.EventConsumer`); `encoder.EnvelopeEncoder` turns the envelopes the relay
publishes into messages for that actor.

Set-up declares the whole topology with an administrator's user (`declare_topology`); each
service declares its own part at start with its own, least-privileged user (`declare_own`).
"""

from __future__ import annotations

import logging
import threading
import urllib.parse
from typing import Any

import dramatiq
import pika
from castad_contracts import topology
from dramatiq.brokers.rabbitmq import RabbitmqBroker, dq_name
from dramatiq.middleware import CurrentMessage

from castad_runtime import outages

log = logging.getLogger(__name__)
DECLARE_TIMEOUT_S = 10.0


class ServiceBroker(RabbitmqBroker):
    """Dramatiq's RabbitMQ broker, publishing through the service's requeue exchange.

    Dramatiq publishes its delayed messages (a handler's retry, a held event) to `<queue>.DQ`
    through the default exchange, which would need a permission to write into every queue.
    This broker's channel sends them through `Topology.requeue_exchange(queue)` instead.
    """

    def __init__(self, *, url: str, requeue_exchange: str) -> None:
        super().__init__(url=url, confirm_delivery=True)
        self.requeue_exchange = requeue_exchange

    @property
    def channel(self) -> Any:
        return _RequeueChannel(RabbitmqBroker.channel.fget(self), self.requeue_exchange)  # type: ignore[attr-defined]

    @channel.deleter
    def channel(self) -> None:
        RabbitmqBroker.channel.fdel(self)  # type: ignore[attr-defined]


class _RequeueChannel:
    """A pika channel whose publishes to the default exchange go to one requeue exchange."""

    def __init__(self, channel: Any, requeue_exchange: str) -> None:
        self._channel = channel
        self._requeue_exchange = requeue_exchange

    def basic_publish(self, exchange: str, routing_key: str, body: bytes, **options: Any) -> None:
        self._channel.basic_publish(exchange or self._requeue_exchange, routing_key, body, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


def make_broker(amqp_url: str, queue: str) -> RabbitmqBroker:
    """The broker of the service consuming `queue`."""
    broker = ServiceBroker(url=amqp_url, requeue_exchange=topology.Topology.requeue_exchange(queue))
    broker.add_middleware(CurrentMessage())  # lets the event actor read and extend its message's options
    dramatiq.set_broker(broker)
    return broker


def event_actor_name(service: str) -> str:
    return f"{service}.on_event"


def declare_topology(amqp_url: str, topo: topology.Topology) -> None:
    """Declare every exchange, queue (as Dramatiq declares it) and binding of the namespace."""
    _declare(amqp_url, topo, topo.services, shared=True)


def declare_own(amqp_url: str, topo: topology.Topology, service: str) -> None:
    """Declare what `service` owns: its queues, its requeue exchange, its bindings (and, for the
    gateway, the exchanges and queue every service shares). The events exchange must exist first."""
    _declare(amqp_url, topo, (service,), shared=service == topology.SHARED_OWNER)


def _declare(amqp_url: str, topo: topology.Topology, services: tuple[str, ...], shared: bool) -> None:
    # A broker that takes the connection but never answers (a partition) must not hold a start for long.
    broker = RabbitmqBroker(
        url=_with_query(amqp_url, socket_timeout=DECLARE_TIMEOUT_S, stack_timeout=DECLARE_TIMEOUT_S)
    )
    try:
        for service in services:
            broker.declare_queue(topo.queue(service), ensure=True)
        channel = broker.channel
        if shared:
            channel.exchange_declare(topo.exchange, exchange_type="topic", durable=True)
            channel.exchange_declare(topo.dead_letter_exchange, exchange_type="fanout", durable=True)
            channel.queue_declare(topo.dead_letter_queue, durable=True)
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
        broker.close()


def declare_own_when_reachable(
    amqp_url: str, topo: topology.Topology, service: str, stop: threading.Event | None = None
) -> None:
    """`declare_own`, tried again until it succeeds: a service started during a broker outage (or
    before the gateway first declared the shared exchanges) waits instead of exiting. Raises
    outages.Stopped if `stop` is set meanwhile."""
    outages.keep_trying(
        lambda: declare_own(amqp_url, topo, service), "declaring its queues", stop=stop, first_s=0.5, max_s=10.0
    )


def _with_query(url: str, **values: float) -> str:
    """The URL with these query parameters added (pika reads its connection settings from them)."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query) + [(key, str(value)) for key, value in values.items()]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def delete_topology(amqp_url: str, topo: topology.Topology) -> None:
    """Remove every queue and the exchange of a namespace (used by tests)."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
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
