"""From a relay-published envelope to a Dramatiq actor, in one place.

The relay publishes CloudEvents envelopes (not Dramatiq messages) to the topic
exchange. Each consuming service has one queue and one actor, `<service>.on_event`;
`EnvelopeEncoder` turns every envelope arriving on that queue into a message for
that actor, and `EventConsumer` dispatches it by event type to the service's
handlers. Anything that cannot be parsed, has no handler, or still fails its handler
after the last retry goes, with the reason, to the dead-letter queue and is
acknowledged: it never crashes a worker or blocks the queue.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import dramatiq
import pika
import pydantic
from castad_contracts import envelope as envelope_
from castad_contracts import events, topology
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import dq_name
from dramatiq.encoder import Encoder, MessageData
from dramatiq.middleware import CurrentMessage
from opentelemetry import trace

from castad_runtime import logs, telemetry

log = logging.getLogger(__name__)

DEAD_LETTER_ACTOR = "castad.dead_letter"
REASON_MAX = 1000  # characters of a dead letter's reason header
Handler = Callable[[envelope_.Envelope, events.Payload], None]


def make_broker(amqp_url: str) -> RabbitmqBroker:
    broker = RabbitmqBroker(url=amqp_url, confirm_delivery=True)
    broker.add_middleware(CurrentMessage())  # lets the event actor see how often it was retried
    dramatiq.set_broker(broker)
    return broker


def event_actor_name(service: str) -> str:
    return f"{service}.on_event"


class EnvelopeEncoder(Encoder):
    """Decodes envelopes into messages for the service's event actor.

    Messages Dramatiq itself enqueued (its own retries) keep their usual JSON form.
    """

    def __init__(self, queue_name: str, actor_name: str) -> None:
        self.queue_name = queue_name
        self.actor_name = actor_name

    def encode(self, data: MessageData) -> bytes:
        return json.dumps(data, separators=(",", ":")).encode()

    def decode(self, data: bytes) -> MessageData:
        try:
            document = json.loads(data)
        except ValueError as error:
            return self._dead(data, f"not JSON: {error}")
        if not isinstance(document, dict):
            return self._dead(data, "not a JSON object")
        if "specversion" in document:
            return self._event(data, document)
        if "actor_name" in document:
            return self._own(data, document)
        return self._dead(data, "neither a CloudEvents envelope nor a Dramatiq message")

    def _own(self, data: bytes, document: dict[str, Any]) -> MessageData:
        """A message Dramatiq enqueued itself (a retry, via the delay queue): kept only if it is
        one of this queue's, for its actors, with their arguments, else Dramatiq would refuse it
        or its actor would fail on it every time."""
        reason = self._unrunnable(document)
        if reason is None:
            return document
        # Dramatiq acknowledges a message on the queue its message names: the delay queue's own.
        delayed = document.get("queue_name") == dq_name(self.queue_name)
        return self._dead(data, reason, dq_name(self.queue_name) if delayed else self.queue_name)

    def _unrunnable(self, document: dict[str, Any]) -> str | None:
        try:
            message = _DramatiqMessage.model_validate(document)
        except pydantic.ValidationError as error:
            return f"invalid Dramatiq message: {_short(error)}"
        if message.queue_name not in (self.queue_name, dq_name(self.queue_name)):
            return f"a Dramatiq message for queue {message.queue_name!r}"
        arguments = {self.actor_name: (dict,), DEAD_LETTER_ACTOR: (str, str)}.get(message.actor_name)
        if arguments is None:
            return f"a Dramatiq message for unknown actor {message.actor_name!r}"
        if message.kwargs or [type(arg) for arg in message.args] != list(arguments):
            return f"a Dramatiq message with bad arguments for {message.actor_name}"
        return None

    def _event(self, data: bytes, document: dict[str, Any]) -> MessageData:
        try:
            env = envelope_.Envelope.model_validate(document)
        except pydantic.ValidationError as error:
            return self._dead(data, f"invalid envelope: {_short(error)}")
        return self._message(self.actor_name, [document], str(env.id))

    def _dead(self, data: bytes, reason: str, queue_name: str | None = None) -> MessageData:
        raw = base64.b64encode(data).decode()
        return self._message(DEAD_LETTER_ACTOR, [raw, reason], None, queue_name)

    def _message(
        self, actor: str, args: list[Any], message_id: str | None, queue_name: str | None = None
    ) -> MessageData:
        return {
            "queue_name": queue_name or self.queue_name,
            "actor_name": actor,
            "args": args,
            "kwargs": {},
            "options": {},
            "message_id": message_id or str(uuid.uuid4()),
            "message_timestamp": int(time.time() * 1000),
        }


class _DramatiqMessage(pydantic.BaseModel):
    """The fields of dramatiq.Message, as its JSON encoder writes them."""

    model_config = pydantic.ConfigDict(extra="forbid", strict=True)

    queue_name: str
    actor_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    message_id: str
    message_timestamp: int


def _short(error: pydantic.ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:5])


class EventConsumer:
    """The one actor of a service's queue, dispatching envelopes by type."""

    def __init__(
        self,
        broker: RabbitmqBroker,
        service: str,
        topo: topology.Topology,
        handlers: Mapping[str, Handler],
        max_retries: int = 20,
    ) -> None:
        self.broker = broker
        self.service = service
        self.topology = topo
        self.handlers = dict(handlers)
        self.max_retries = max_retries
        self.queue_name = topo.queue(service)
        self.tracer = telemetry.tracer(f"castad.{service}")
        dramatiq.set_encoder(EnvelopeEncoder(self.queue_name, event_actor_name(service)))
        # Dramatiq retries cover infrastructure failures inside a handler (database
        # briefly down); provider failures are the stage machine's, recorded in SQL.
        self.actor = dramatiq.actor(
            actor_name=event_actor_name(service),
            queue_name=self.queue_name,
            broker=broker,
            max_retries=max_retries,
            min_backoff=200,
            max_backoff=10_000,
            time_limit=24 * 3600 * 1000,
        )(self.on_event)
        self.dead_actor = dramatiq.actor(actor_name=DEAD_LETTER_ACTOR, queue_name=self.queue_name, broker=broker)(
            self.dead_letter
        )

    def on_event(self, document: dict[str, Any]) -> None:
        env = envelope_.Envelope.model_validate(document)
        handler = self.handlers.get(env.type)
        if handler is None:
            self.dead_letter(_encode(document), f"no handler for {env.type!r} in {self.service}")
            return
        try:
            payload = env.payload()
        except (events.UnknownEventType, pydantic.ValidationError) as error:
            reason = _short(error) if isinstance(error, pydantic.ValidationError) else str(error)
            self.dead_letter(_encode(document), f"unreadable {env.type} payload: {reason}")
            return
        with (
            telemetry.continued(env.traceparent, env.tracestate),
            self.tracer.start_as_current_span(
                f"handle {env.type}",
                kind=trace.SpanKind.CONSUMER,
                attributes={
                    "messaging.system": "rabbitmq",
                    "messaging.message.id": str(env.id),
                    "castad.pipeline_id": env.subject,
                },
            ),
            logs.bound(env.subject, str(env.id)),
        ):
            try:
                handler(env, payload)
            except Exception as error:
                message = CurrentMessage.get_current_message()
                retries = message.options.get("retries", 0) if message else 0
                if retries < self.max_retries:
                    raise  # Dramatiq retries it with backoff
                reason = f"{env.type} handler failed {retries + 1} times, last: {error!r}"
                self.dead_letter(_encode(document), reason[:REASON_MAX])

    def dead_letter(self, raw_b64: str, reason: str) -> None:
        """Park a message that cannot be handled, with the reason in its headers."""
        body = base64.b64decode(raw_b64)
        log.warning("dead-lettering message: %s", reason)
        self.broker.channel.basic_publish(
            exchange="",
            routing_key=self.topology.dead_letter_queue,
            body=body,
            properties=pika.BasicProperties(
                delivery_mode=2,
                headers={
                    "x-castad-reason": reason,
                    "x-castad-service": self.service,
                    "x-castad-queue": self.queue_name,
                },
            ),
        )


def _encode(document: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(document).encode()).decode()


def declare_topology(amqp_url: str, topo: topology.Topology) -> None:
    """Declare the exchange, every service queue (as Dramatiq declares it) and the bindings."""
    broker = RabbitmqBroker(url=amqp_url)
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
