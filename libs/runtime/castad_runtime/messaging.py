"""The broker a service consumes with, and the exchange, queues and bindings of a namespace.

Each consuming service has one queue and one actor on it, `<service>.on_event`
(see `consumer.EventConsumer`); `encoder.EnvelopeEncoder` turns the envelopes the relay
publishes into messages for that actor.
"""

from __future__ import annotations

import logging
import threading
import urllib.parse

import dramatiq
import pika
from castad_contracts import topology
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import CurrentMessage

from castad_runtime import outages

log = logging.getLogger(__name__)
DECLARE_TIMEOUT_S = 10.0


def make_broker(amqp_url: str) -> RabbitmqBroker:
    broker = RabbitmqBroker(url=amqp_url, confirm_delivery=True)
    broker.add_middleware(CurrentMessage())  # lets the event actor read and extend its message's options
    dramatiq.set_broker(broker)
    return broker


def event_actor_name(service: str) -> str:
    return f"{service}.on_event"


def declare_topology(amqp_url: str, topo: topology.Topology) -> None:
    """Declare the exchange, every service queue (as Dramatiq declares it) and the bindings."""
    # A broker that takes the connection but never answers (a partition) must not hold a start for long.
    broker = RabbitmqBroker(
        url=_with_query(amqp_url, socket_timeout=DECLARE_TIMEOUT_S, stack_timeout=DECLARE_TIMEOUT_S)
    )
    try:
        for service in topo.services:
            broker.declare_queue(topo.queue(service), ensure=True)
        channel = broker.channel
        channel.exchange_declare(topo.exchange, exchange_type="topic", durable=True)
        channel.queue_declare(topo.dead_letter_queue, durable=True)
        for service in topo.services:
            for key in topo.bindings(service):
                channel.queue_bind(topo.queue(service), topo.exchange, routing_key=key)
    finally:
        broker.close()


def declare_topology_when_reachable(
    amqp_url: str, topo: topology.Topology, stop: threading.Event | None = None
) -> None:
    """`declare_topology`, tried again until the broker answers: a service started during a broker
    outage waits for it instead of exiting. Raises outages.Stopped if `stop` is set meanwhile."""
    outages.keep_trying(
        lambda: declare_topology(amqp_url, topo), "declaring the topology", stop=stop, first_s=0.5, max_s=10.0
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
        channel.queue_delete(topo.dead_letter_queue)
        channel.exchange_delete(topo.exchange)
    finally:
        connection.close()
