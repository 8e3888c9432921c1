"""A dead-lettered message as the row recorded of it: where it came from, why, and the event it carries.

Where a letter came from is known from what nobody can forge. A message a queue dead-lettered
carries the broker's `x-death`, whose newest entry names that queue (the broker puts it first,
whatever the message's own headers say): that queue is the letter's, and nothing in its headers
is believed about it. Only the relay, the gateway and an administrator may publish into the
dead-letter exchange themselves (`topology.Topology.permissions`), so what arrives without an
`x-death` is theirs, and their headers say where it came from (a parked row's notice, a message
`castad-admin move-to-quorum` moved).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import uuid
from typing import Any

from castad_contracts import topology
from castad_runtime import consumer, encoder, redact

PARKED_HEADER = "x-castad-parked-event"


def describe(message_id: str | None, headers: dict[str, Any], body: bytes, body_max: int) -> dict[str, Any]:
    """The row of a dead-letter message.

    Where it came from, why, and what it is, as far as it can be read. Texts lose their NUL characters, which
    PostgreSQL cannot store (the body keeps every byte).
    """
    headers = _clean(json.loads(json.dumps(headers, default=str)))
    fields: dict[str, Any] = {"message_id": _clean(message_id) or _fingerprint(headers, body), "headers": headers}
    death = _first_death(headers)
    reason: str | None
    if death:  # a queue dead-lettered it: the broker's word of which, nothing the message says of itself
        queue = _service_queue(death.get("queue"))
        filed = _filed(body)
        if filed is not None:
            # The consumer's id of the letter (the same for the same message filed again), in its queue alone.
            letter_id, body, reason = filed
            fields["message_id"] = f"filed:{queue}:{letter_id}"
        else:
            reason = _text(headers.get("x-castad-reason")) or _broker_reason(death)
        fields |= {"kind": "message", "service": _service_of(queue), "queue": queue}
    else:  # published into the dead-letter exchange by the relay, the gateway or an administrator
        queue = _text(headers.get("x-castad-queue"))
        reason = _text(headers.get("x-castad-reason"))
        fields |= {
            "kind": "parked" if headers.get(PARKED_HEADER) else "message",
            "service": _text(headers.get("x-castad-service")) or _service_of(queue),
            "queue": queue,
        }
    fields |= {"reason": _clean(reason or "no reason given")[:2000], "body": body[:body_max], "body_size": len(body)}
    document = event_document(body)
    if document is not None:
        fields["event_type"] = _text(document.get("type"), limit=200)
        fields["pipeline_id"] = _text(document.get("subject"), limit=200)
        version = document.get("schemaversion")
        fields["schema_version"] = version if isinstance(version, int) else None
        with contextlib.suppress(ValueError):
            fields["event_id"] = uuid.UUID(str(document.get("id")))
    return fields


def event_document(body: bytes) -> dict[str, Any] | None:
    """The event a dead letter carries, as a JSON object.

    The body itself, or the envelope inside a Dramatiq message (a retry or a held event that was waiting in a delay
    queue when its queue gave up on it).
    """
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    args = document.get("args")
    if "actor_name" in document and isinstance(args, list) and args and isinstance(args[0], dict):
        return args[0]
    return document


def _filed(body: bytes) -> tuple[str, bytes, str] | None:
    """The letter's id, the message's bytes and the reason of a dead letter a consumer filed, if any.

    None unless `body` is a dead letter filed by castad_runtime.consumer.
    """
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("actor_name") != encoder.DEAD_LETTER_ACTOR:
        return None
    options, args = document.get("options"), document.get("args")
    if not (isinstance(options, dict) and options.get(consumer.FILED_OPTION)):
        return None
    if not (isinstance(args, list) and len(args) == 2 and all(isinstance(arg, str) for arg in args)):
        return None
    try:
        return _clean(str(document.get("message_id"))), base64.b64decode(args[0], validate=True), args[1]
    except (binascii.Error, ValueError):
        return None


def _first_death(headers: dict[str, Any]) -> dict[str, Any]:
    """Why and where the broker last dead-lettered a message, if it did.

    That is the newest entry of its `x-death` header, which the broker puts first.
    """
    deaths = headers.get("x-death")
    return deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}


def _broker_reason(death: dict[str, Any]) -> str | None:
    why = death.get("reason")
    if why is None:
        return None
    if why == "delivery_limit":
        return (
            f"taken more than {topology.DELIVERY_LIMIT} times and never acknowledged: its consumer died or was"
            " stopped each time it had it (the queue's delivery limit)"
        )
    if why == "rejected":
        return "rejected by its consumer"
    return f"dead-lettered by the broker: {why}"


def _service_queue(queue: object) -> str | None:
    """A service's queue for one of its own queues: a delay queue's messages go back to the queue it serves."""
    if not isinstance(queue, str):
        return None
    return queue.removesuffix(".DQ")


def _service_of(queue: str | None) -> str | None:
    service = (queue or "").rpartition(".")[2]
    return service if service in topology.SUBSCRIPTIONS else None


def _text(value: object, limit: int = 2000) -> str | None:
    return _clean(value)[:limit] if isinstance(value, str) else None


def _clean(value: Any) -> Any:
    """`value` (a JSON document) without NUL characters in any of its strings."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {_clean(key): _clean(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clean(item) for item in value]
    return value


def _fingerprint(headers: dict[str, Any], body: bytes) -> str:
    """For a message without an id: the same message always gets the same one."""
    digest = hashlib.sha256(body)
    digest.update(json.dumps(headers, sort_keys=True, default=str).encode())
    return f"sha256:{digest.hexdigest()}"


def bare(fields: dict[str, Any], error: Exception) -> dict[str, Any]:
    """What can always be recorded of a dead letter: its id, its body and why the rest could not be."""
    return {
        "message_id": fields["message_id"],
        "kind": "unrecordable",
        "reason": f"could not be recorded as it is: {redact.describe(error)}",
        "headers": {},
        "body": fields["body"],
        "body_size": fields["body_size"],
    }
