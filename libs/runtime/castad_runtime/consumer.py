"""The one actor on a service's queue: envelopes dispatched by type to the service's handlers.

What becomes of a message (acknowledged, tried again through an outage, held, retried,
dead-lettered) and its metrics: docs/concepts/consumers.md.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import dramatiq
import pydantic
from castad_contracts import envelope as envelope_
from castad_contracts import events, topology
from dramatiq.broker import MessageProxy
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import CurrentMessage, Middleware
from opentelemetry import trace

from castad_runtime import backoff, encoder, logs, messaging, outages, redact, telemetry
from castad_runtime import metrics as metrics_

log = logging.getLogger(__name__)

T = TypeVar("T")
Handler = Callable[[envelope_.Envelope, events.Payload], None]
REASON_MAX = 1000  # characters of a dead letter's reason header
RETRIES_OPTION = "castad_retries"  # message option: how often its handler failed so far
HELD_SINCE_OPTION = "castad_held_since_ms"  # message option: when this service first held it
OUTAGE_OPTION = "castad_outage"  # message option: handed back after waiting out an outage for HAND_BACK_AFTER_S
HAND_BACK_AFTER_S = 600.0  # well within RabbitMQ's default consumer_timeout (30 minutes)
HAND_BACK_DELAY_S = 5.0
FILED_OPTION = "castad_filed"  # message option: a dead letter filed, to be rejected into the dead-letter exchange
RETRY_BACKOFF_S = (0.2, 10.0)  # first and longest delay between a failing handler's tries
HOLD_BACKOFF_S = (1.0, 60.0)  # first and longest delay between looks at a newer-version event


class Hold(Exception):
    """Raised by a handler that cannot take its message yet (it depends on one still to come).

    The message is held like an event of a newer version, then dead-lettered if it is still not takeable.
    """


class _Abandoned(Exception):
    """The worker stopped during an outage: the message stays unacknowledged, back in its queue."""


class _WorkerLifecycle(Middleware):
    """Tells the consumer when its worker starts stopping and when its consumers are closed."""

    def __init__(self, stopping: threading.Event, closed: threading.Event) -> None:
        self.stopping = stopping
        self.closed = closed

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.stopping.set()

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.closed.set()


class EventConsumer:
    """The event actor and the dead-letter actor of a service's queue."""

    def __init__(
        self,
        broker: RabbitmqBroker,
        service: str,
        topo: topology.Topology,
        handlers: Mapping[str, Handler],
        *,
        max_retries: int = 20,
        hold_s: float = 3600.0,
        hand_back_after_s: float = HAND_BACK_AFTER_S,
        registry: events.Registry = events.REGISTRY,
        metrics: metrics_.ConsumerMetrics | None = None,
    ) -> None:
        self.broker = broker
        self.hand_back_after_s = hand_back_after_s
        self.service = service
        self.topology = topo
        self.handlers = dict(handlers)
        self.max_retries = max_retries
        self.hold_s = hold_s
        self.registry = registry
        self.metrics = metrics or metrics_.ConsumerMetrics(metrics_.registry(), service)
        self.queue_name = topo.queue(service)
        self.tracer = telemetry.tracer(f"castad.{service}")
        self._stopping = threading.Event()
        self._closed = threading.Event()
        self._rng = random.Random()
        broker.add_middleware(_WorkerLifecycle(self._stopping, self._closed))
        dramatiq.set_encoder(encoder.EnvelopeEncoder(self.queue_name, messaging.event_actor_name(service)))
        # Nothing but a bug of this module escapes the actors; Dramatiq's own retries are the last resort.
        self.actor = dramatiq.actor(
            actor_name=messaging.event_actor_name(service),
            queue_name=self.queue_name,
            broker=broker,
            max_retries=max_retries,
            time_limit=24 * 3600 * 1000,
        )(self.on_event)
        self.dead_actor = dramatiq.actor(
            actor_name=encoder.DEAD_LETTER_ACTOR, queue_name=self.queue_name, broker=broker, max_retries=max_retries
        )(self.dead_letter)

    def reads(self) -> dict[str, int]:
        """Each event type this consumer handles, and the newest version of it it reads (see `announcement`)."""
        return {event_type: self.registry.current_version(event_type) for event_type in sorted(self.handlers)}

    def on_event(self, document: dict[str, Any]) -> None:
        try:
            self._dispatch(envelope_.Envelope.model_validate(document), document)
        except _Abandoned:
            log.info("worker stopped during an outage; the message stays in %s", self.queue_name)

    def dead_letter(self, raw_b64: str, reason: str) -> None:
        """The dead-letter actor.

        A dead letter this consumer filed is rejected, for the broker to dead-letter it from this queue; a message
        the encoder could not turn into an event is filed.
        """
        message = CurrentMessage.get_current_message()  # a MessageProxy while the actor runs
        if isinstance(message, MessageProxy) and message.options.get(FILED_OPTION):
            message.fail()  # Dramatiq rejects a failed message without requeueing it: the queue dead-letters it
            return
        try:
            body = base64.b64decode(raw_b64)
            self._through_outages(lambda: self._file(body, reason, metrics_.UNDECODABLE))
        except _Abandoned:
            log.info("worker stopped during an outage; the message stays in %s", self.queue_name)

    def _dispatch(self, env: envelope_.Envelope, document: dict[str, Any]) -> None:
        handler = self.handlers.get(env.type)
        if handler is None:
            self._dead(document, f"no handler for {env.type!r} in {self.service}", metrics_.UNKNOWN_TYPE)
            return
        producer = topology.PRODUCERS.get(env.type)
        if producer is None or env.source != topology.SOURCES[producer]:
            expected = topology.SOURCES[producer] if producer else "no service"
            self._dead(document, f"{env.type} from {env.source}: only {expected} produces it", metrics_.WRONG_SOURCE)
            return
        try:
            payload = env.payload(self.registry)
        except events.NewerSchemaVersion as error:
            self._through_outages(functools.partial(self._hold, document, str(error)))
            return
        except events.UnknownEventType as error:
            self._dead(document, f"unreadable {env.type} payload: {error}", metrics_.UNKNOWN_TYPE)
            return
        except pydantic.ValidationError as error:
            reason = redact.validation_summary(error)
            self._dead(document, f"unreadable {env.type} payload: {reason}", metrics_.INVALID_PAYLOAD)
            return
        message = CurrentMessage.get_current_message()
        if message is None or not {RETRIES_OPTION, HELD_SINCE_OPTION, OUTAGE_OPTION} & set(message.options):
            self.metrics.handed_off(env.type, env.time)  # a retry's or a held event's wait is not a handoff
        with (
            telemetry.continued(env.traceparent, env.tracestate),
            self.tracer.start_as_current_span(
                f"process {self.topology.exchange}",  # OpenTelemetry messaging: "{operation} {destination}"
                kind=trace.SpanKind.CONSUMER,
                attributes={
                    "messaging.system": "rabbitmq",
                    "messaging.operation.name": "process",
                    "messaging.operation.type": "process",
                    "messaging.destination.name": self.topology.exchange,
                    "messaging.destination.subscription.name": self.queue_name,
                    "messaging.message.id": str(env.id),
                    "messaging.rabbitmq.destination.routing_key": env.type,
                    "castad.pipeline_id": env.subject,
                },
            ),
            logs.bound(env.subject, str(env.id)),
        ):
            try:
                self._through_outages(lambda: handler(env, payload), hand_back_after_s=self.hand_back_after_s)
            except outages.Outlasted as outlasted:
                log.warning("%s; handed back through the delay queue", outlasted)
                self._through_outages(self._hand_back)
            except _Abandoned:
                raise
            except Hold as hold:
                self._through_outages(functools.partial(self._hold, document, str(hold)))
            except Exception as error:
                self._through_outages(functools.partial(self._retry_later, document, env, error))

    def _through_outages(self, action: Callable[[], T], hand_back_after_s: float | None = None) -> T:
        """`action()`, tried again for as long as it fails on an outage.

        _Abandoned if the worker stops, outages.Outlasted after `hand_back_after_s`.
        """
        try:
            return outages.keep_trying(
                action,
                f"{self.service} consumer (message kept)",
                stop=self._stopping,
                give_up_after_s=hand_back_after_s,
            )
        except outages.Stopped:
            # Wait until the worker's consumers are closed: the broker has then put this unacknowledged
            # message back in the queue, and Dramatiq's ack can only fail.
            self._closed.wait()
            raise _Abandoned() from None

    def _retry_later(self, document: dict[str, Any], env: envelope_.Envelope, error: Exception) -> None:
        message = CurrentMessage.get_current_message()
        retries = message.options.get(RETRIES_OPTION, 0) if message else self.max_retries
        if retries >= self.max_retries:
            self._file(
                _encode(document),
                f"{env.type} handler failed {retries + 1} times, last: {redact.describe(error)}",
                metrics_.HANDLER_FAILED,
            )
            return
        assert message is not None
        delay_s = backoff.exponential_s(retries, *RETRY_BACKOFF_S, jitter=0.3, rng=self._rng)
        log.warning(
            "%s handler failed (%s); try %d of %d in %.1f s",
            env.type,
            redact.describe(error),
            retries + 2,
            self.max_retries + 1,
            delay_s,
            exc_info=True,
        )
        self.broker.enqueue(message.copy(options={RETRIES_OPTION: retries + 1}), delay=int(delay_s * 1000))

    def _hold(self, document: dict[str, Any], reason: str) -> None:
        message = CurrentMessage.get_current_message()
        now_ms = int(time.time() * 1000)
        since_ms = message.options.get(HELD_SINCE_OPTION, now_ms) if message else now_ms
        held_s, remaining_s = (now_ms - since_ms) / 1000, self.hold_s - (now_ms - since_ms) / 1000
        if message is None or remaining_s <= 0:
            reason = f"{reason}; held {held_s:.0f} s"
            self._file(_encode(document), reason, metrics_.HELD_TOO_LONG)
            return
        delay_s = min(max(held_s, HOLD_BACKOFF_S[0]), HOLD_BACKOFF_S[1], remaining_s)
        log.warning("%s; held, next look in %.1f s (dead-lettered after %.0f s more)", reason, delay_s, remaining_s)
        self.broker.enqueue(message.copy(options={HELD_SINCE_OPTION: since_ms}), delay=int(delay_s * 1000))

    def _hand_back(self) -> None:
        """Send the message being handled back to this queue through the delay queue, as it is.

        A retry and a held event keep what they counted. It is handled again once HAND_BACK_DELAY_S passed.
        """
        message = CurrentMessage.get_current_message()
        assert message is not None
        self.broker.enqueue(message.copy(options={OUTAGE_OPTION: True}), delay=int(HAND_BACK_DELAY_S * 1000))

    def _dead(self, document: dict[str, Any], reason: str, kind: str) -> None:
        self._through_outages(lambda: self._file(_encode(document), reason, kind))

    def _file(self, body: bytes, reason: str, kind: str) -> None:
        """File a message that cannot be handled as a dead letter, with the reason.

        A message of this queue for the dead-letter actor, which rejects it into the dead-letter exchange (see the
        module docstring); confirmed by the broker. `kind`: why, in a word (the metric's label).
        """
        reason = redact.mask(reason)[:REASON_MAX]
        log.warning("dead-lettering message: %s", reason)
        letter: dramatiq.Message[None] = dramatiq.Message(
            queue_name=self.queue_name,
            actor_name=encoder.DEAD_LETTER_ACTOR,
            args=(base64.b64encode(body).decode(), reason),
            kwargs={},
            options={FILED_OPTION: True},
            message_id=filed_id(self.queue_name, body),
        )
        self.broker.enqueue(letter)  # through this queue's requeue exchange (messaging.ServiceBroker)
        self.metrics.dead_lettered(kind)


def filed_id(queue: str, body: bytes) -> str:
    """The id of the dead letter filed for `body` on `queue`.

    The same message filed again (its delivery repeated, by a consumer stopped before it acknowledged it) is the
    same letter, recorded once.
    """
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"castad-dead-letter:{queue}:{hashlib.sha256(body).hexdigest()}"))


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode()
