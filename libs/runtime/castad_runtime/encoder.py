"""Decoding what arrives on a service's queue into a message for one of its two actors.

The relay publishes CloudEvents envelopes (not Dramatiq messages) to the topic exchange.
`EnvelopeEncoder` turns every envelope arriving on a service's queue into a message for
its event actor (`<service>.on_event`), and anything it cannot read into a message for the
dead-letter actor, with the reason. Messages Dramatiq enqueued itself (delayed retries)
keep their JSON form and are checked against the queue's own actors and arguments.

An envelope must have come the way its type routes it: under its own type (from the events exchange) or under
this queue's name (a replay the gateway sent back to it alone). The consumer hands the encoder each delivery's
routing key with its body (`delivering`, `messaging.ServiceBroker`); a body of another type than its key is a
dead letter, whatever it says of itself.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from typing import Any

import pydantic
from castad_contracts import envelope as envelope_
from dramatiq.common import dq_name
from dramatiq.encoder import Encoder, MessageData

from castad_runtime import redact

DEAD_LETTER_ACTOR = "castad.dead_letter"
_delivery = threading.local()  # the routing key of the delivery being decoded by this thread's consumer


def delivering(routing_key: str | None) -> None:
    """Said by the consumer's thread before it decodes a delivery's body: the routing key it came under."""
    _delivery.routing_key = routing_key


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
        """A message Dramatiq enqueued itself (a retry, via the delay queue).

        Kept only if it is one of this queue's, for its actors, with their arguments, else Dramatiq would refuse it
        or its actor would fail on it every time.
        """
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
            return f"invalid Dramatiq message: {redact.validation_summary(error)}"
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
            return self._dead(data, f"invalid envelope: {redact.validation_summary(error)}")
        routing_key = getattr(_delivery, "routing_key", None)
        if routing_key is not None and routing_key not in (env.type, self.queue_name):
            return self._dead(data, f"a {env.type} delivered under routing key {routing_key!r}")
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
