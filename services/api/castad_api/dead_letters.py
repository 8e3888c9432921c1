"""Dead letters where an operator can see, replay and discard them.

`Recorder` moves every message of the dead-letter queue into the gateway's database (a
message is acknowledged only once recorded, and recorded once however often it comes):
messages a consumer could not handle (it filed each, with the reason, and rejected it on its
own queue), messages a service's queue gave up on (taken and never acknowledged
`topology.DELIVERY_LIMIT` times: they killed or stopped their consumers), and notices of outbox
rows the relay parked.

Where a letter came from is known from what nobody can forge. A message a queue dead-lettered
carries the broker's `x-death`, whose newest entry names that queue (the broker puts it first,
whatever the message's own headers say): that queue is the letter's, and nothing in its headers
is believed about it. Only the relay, the gateway and an administrator may publish into the
dead-letter exchange themselves (`topology.Topology.permissions`), so what arrives without an
`x-death` is theirs, and their headers say where it came from (a parked row's notice, a message
`castad-admin move-to-quorum` moved). A replay sends a message back to the queue it came from
(that one alone) through the gateway's outbox, upcast to the newest version of its type the
gateway knows, keeping its producer's source (castad_relay.ownership); a parked row is handed back
to the relay by the service whose outbox holds it. Replaying twice is harmless: the
consumer's inbox makes the effect happen once, as long as it remembers the event, so a
message older than CASTAD_RETENTION_INBOX_S is not sent back (castad_api.retention).
Every replay and discard is an action row (who, when, what) and an entry of its
pipeline's timeline.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import hashlib
import json
import logging
import threading
import uuid
from typing import Any

import pydantic
import sqlalchemy as sa
from castad_contracts import envelope as envelope_
from castad_contracts import events, ids, topology
from castad_runtime import amqp, backoff, consumer, db, encoder, outages, outbox, redact
from sqlalchemy.dialects import postgresql as pg

from castad_api import errors, projection, records, repository, retention, tables
from castad_api.repository import columns, typed

log = logging.getLogger(__name__)
SOURCE = topology.SOURCES[topology.GATEWAY]
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
    document = _event_document(body)
    if document is not None:
        fields["event_type"] = _text(document.get("type"), limit=200)
        fields["pipeline_id"] = _text(document.get("subject"), limit=200)
        version = document.get("schemaversion")
        fields["schema_version"] = version if isinstance(version, int) else None
        with contextlib.suppress(ValueError):
            fields["event_id"] = uuid.UUID(str(document.get("id")))
    return fields


def _event_document(body: bytes) -> dict[str, Any] | None:
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


def _bare(fields: dict[str, Any], error: Exception) -> dict[str, Any]:
    """What can always be recorded of a dead letter: its id, its body and why the rest could not be."""
    return {
        "message_id": fields["message_id"],
        "kind": "unrecordable",
        "reason": f"could not be recorded as it is: {redact.describe(error)}",
        "headers": {},
        "body": fields["body"],
        "body_size": fields["body_size"],
    }


def record(conn: sa.Connection, fields: dict[str, Any]) -> int | None:
    """Record a dead letter once; an entry in its pipeline's timeline if it is one of ours. Its id, None if seen."""
    letter_id = add_dead_letter(conn, fields)
    if letter_id is not None:
        _note(conn, fields.get("pipeline_id"), "dead_letter.recorded", dead_letter=letter_id, reason=fields["reason"])
    return letter_id


def replay(
    conn: sa.Connection, letter_id: int, actor: str, policy: retention.Policy, key: dict[str, str] | None = None
) -> str:
    """Send a dead letter again, for `actor` with the API key `key` (keys.Principal.acting).

    What was done (for the action row and the answer).
    """
    letter = _get(conn, letter_id)
    if letter.status == "discarded":
        raise errors.Conflict(f"dead letter {letter_id} was discarded", letter.status)
    detail = _republish(conn, letter) if letter.kind == "parked" else _send_back(conn, letter, policy)
    dead_letter_acted(conn, letter_id, "replay", actor, detail, status="replayed", key=key)
    acting = {"actor_key": key} if key else {}
    _note(conn, letter.pipeline_id, "dead_letter.replayed", dead_letter=letter_id, actor=actor, detail=detail, **acting)
    return detail


def discard(conn: sa.Connection, letter_id: int, actor: str, reason: str, key: dict[str, str] | None = None) -> None:
    letter = _get(conn, letter_id)
    dead_letter_acted(conn, letter_id, "discard", actor, reason, status="discarded", key=key)
    acting = {"actor_key": key} if key else {}
    _note(
        conn, letter.pipeline_id, "dead_letter.discarded", dead_letter=letter_id, actor=actor, detail=reason, **acting
    )


def replay_matching(
    conn: sa.Connection,
    filters: LetterFilters,
    actor: str,
    limit: int,
    policy: retention.Policy,
    key: dict[str, str] | None = None,
) -> tuple[list[int], dict[int, str]]:
    """Replay every dead letter still `dead` that matches, up to `limit`: ids replayed, and why others were not."""
    replayed, refused = [], {}
    matching = dataclasses.replace(filters, status="dead")
    for letter in dead_letters(conn, matching, before_id=None, limit=limit):
        try:
            replay(conn, letter.id, actor, policy, key)
        except errors.GatewayError as error:
            refused[letter.id] = str(error)
        else:
            replayed.append(letter.id)
    return replayed, refused


def _get(conn: sa.Connection, letter_id: int) -> records.DeadLetter:
    letter = lock_dead_letter(conn, letter_id)
    if letter is None:
        raise errors.NotFound(f"no dead letter {letter_id}")
    return letter


def _send_back(conn: sa.Connection, letter: records.DeadLetter, policy: retention.Policy) -> str:
    if letter.body_size > len(letter.body):
        raise errors.NotReplayable(f"dead letter {letter.id} was cut to {len(letter.body)} bytes when recorded")
    if not letter.queue:
        raise errors.NotReplayable(f"dead letter {letter.id} does not say which queue it came from")
    if letter.queue.rpartition(".")[2] not in topology.SUBSCRIPTIONS:  # sent back through its requeue exchange
        raise errors.NotReplayable(f"dead letter {letter.id} came from {letter.queue}, no service's queue")
    try:
        env = envelope_.Envelope.model_validate(_event_document(letter.body))
    except pydantic.ValidationError as error:
        raise errors.NotReplayable(
            f"dead letter {letter.id} is not an event ({redact.validation_summary(error, limit=2)}): discard it"
        ) from None
    # The consumer's inbox may have recorded the event as early as its time (a copy dead-lettered later).
    refused = policy.replay_refusal(min(env.time, letter.received_at), repository.now(conn))
    if refused:
        raise errors.Conflict(f"dead letter {letter.id} can no longer be replayed: {refused}", letter.status)
    env = _in_oldest_version(env)
    outbox.append(conn, env, destination=letter.queue, delivery_id=ids.time_ordered())
    return f"sent back to {letter.queue} as {env.type} v{env.schemaversion}"


def _in_oldest_version(env: envelope_.Envelope) -> envelope_.Envelope:
    """The same event as the oldest version of its type that carries it whole, read as this gateway knows it.

    Which a consumer of any release since reads (as a producer writes it: `envelope.wrap`)."""
    try:
        version, data = events.REGISTRY.oldest_carrying(env.type, env.payload())
    except (events.SchemaError, pydantic.ValidationError):
        return env  # a version newer than the gateway knows, or not valid: the consumer it goes back to decides
    return env.model_copy(update={"schemaversion": version, "data": data})


def _republish(conn: sa.Connection, letter: records.DeadLetter) -> str:
    event_id = uuid.UUID(str(letter.headers[PARKED_HEADER]))
    if outbox.republish(conn, [event_id]):
        return "handed back to the relay from the gateway's outbox"
    if letter.pipeline_id is None:
        raise errors.NotReplayable(f"dead letter {letter.id} does not say which pipeline its row is of")
    try:
        request = events.OutboxRepublishRequested(pipeline_id=letter.pipeline_id, event_id=event_id)
    except pydantic.ValidationError:
        raise errors.NotReplayable(f"dead letter {letter.id}: {letter.pipeline_id!r} is not a pipeline id") from None
    outbox.add(conn, request, events.OUTBOX_REPUBLISH_REQUESTED, SOURCE)
    return "asked the service whose outbox holds it to hand it back to the relay"


def _note(conn: sa.Connection, pipeline_id: str | None, event_type: str, **details: Any) -> None:
    """An entry in the timeline of the pipeline a dead letter is about, if it is one of ours."""
    try:
        pipeline = repository.lock_pipeline(conn, uuid.UUID(str(pipeline_id)))
    except ValueError:
        return
    if pipeline is not None:
        fact = event_type.replace(".", "_")  # dead_letter_replayed, ...: clear on the event stream
        projection.record(conn, pipeline, ids.time_ordered(), event_type, None, fact, **details)


class Recorder:
    """A consumer of the dead-letter queue on a thread of its own, recording each message before its ack."""

    def __init__(self, amqp_url: str, queue: str, engine: sa.Engine, body_max: int) -> None:
        self.amqp_url = amqp_url
        self.queue = queue
        self.engine = engine
        self.body_max = body_max
        self.recorded = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dead-letters", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        delays = backoff.Backoff(first_s=0.5, max_s=10.0)
        while not self._stop.is_set():
            try:
                self._consume()
            except Exception as error:
                if not outages.is_outage(error):
                    log.exception("dead-letter recorder failed; starting over")
                else:
                    log.warning("dead-letter recorder lost the broker (%s); reconnecting", redact.describe(error))
                delays.wait(self._stop)

    def _consume(self) -> None:
        connection = amqp.blocking_connection(self.amqp_url)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=20)
            for method, properties, body in channel.consume(self.queue, inactivity_timeout=0.5):
                if self._stop.is_set():
                    return
                if method is None:
                    continue
                fields = self._described(properties, body)
                if not self._record(fields):
                    return  # stopping: the message stays in the queue
                channel.basic_ack(method.delivery_tag)
        finally:
            if connection.is_open:
                connection.close()

    def _described(self, properties: Any, body: bytes) -> dict[str, Any]:
        """`describe`, or, where reading the message fails (a bug), its bare row: it must not come back for ever."""
        try:
            return describe(properties.message_id, dict(properties.headers or {}), body, self.body_max)
        except Exception as error:
            log.exception("cannot read dead letter %s; recording it bare", properties.message_id)
            message_id = str(properties.message_id or f"sha256:{hashlib.sha256(body).hexdigest()}")
            return _bare({"message_id": message_id, "body": body[: self.body_max], "body_size": len(body)}, error)

    def _record(self, fields: dict[str, Any]) -> bool:
        """Record through a database outage.

        False if the recorder stops first. A message that cannot be recorded as it is (a bug) is recorded bare, so
        that it does not hold up the queue behind it.
        """

        def write(row: dict[str, Any]) -> None:
            with db.transaction(self.engine) as conn:
                if record(conn, row) is not None:
                    self.recorded += 1

        try:
            try:
                outages.keep_trying(lambda: write(fields), "recording a dead letter", stop=self._stop, first_s=0.2)
            except outages.Stopped:
                raise
            except Exception as error:
                log.exception("cannot record dead letter %s as it is; recording it bare", fields["message_id"])
                bare = _bare(fields, error)
                outages.keep_trying(lambda: write(bare), "recording a dead letter", stop=self._stop, first_s=0.2)
        except outages.Stopped:
            return False
        return True


# -- Their statements -------------------------------------------------------------------------------------------

letters = tables.dead_letters


@dataclasses.dataclass(frozen=True)
class LetterFilters:
    status: str | None = None
    service: str | None = None
    event_type: str | None = None
    reason: str | None = None  # a part of the reason
    pipeline_id: str | None = None


def add_dead_letter(conn: sa.Connection, fields: dict[str, Any]) -> int | None:
    """Record a dead letter unless its message id is recorded already; its id, or None."""
    return conn.execute(
        pg.insert(letters)
        .values(**fields)
        .on_conflict_do_nothing(index_elements=[letters.c.message_id])
        .returning(letters.c.id)
    ).scalar()


LETTER_COLUMNS = columns(letters, records.DeadLetter)


def lock_dead_letter(conn: sa.Connection, letter_id: int) -> records.DeadLetter | None:
    row = conn.execute(sa.select(*LETTER_COLUMNS).where(letters.c.id == letter_id).with_for_update()).first()
    return None if row is None else typed(records.DeadLetter, row)


def get_dead_letter(conn: sa.Connection, letter_id: int) -> records.DeadLetter | None:
    row = conn.execute(sa.select(*LETTER_COLUMNS).where(letters.c.id == letter_id)).first()
    return None if row is None else typed(records.DeadLetter, row)


def dead_letters(
    conn: sa.Connection, filters: LetterFilters, before_id: int | None, limit: int
) -> list[records.DeadLetter]:
    """Newest first; `before_id` is the id of the last row of the previous page."""
    query = sa.select(*LETTER_COLUMNS).order_by(letters.c.id.desc()).limit(limit)
    for column, value in (
        (letters.c.status, filters.status),
        (letters.c.service, filters.service),
        (letters.c.event_type, filters.event_type),
        (letters.c.pipeline_id, filters.pipeline_id),
    ):
        if value is not None:
            query = query.where(column == value)
    if filters.reason:
        query = query.where(letters.c.reason.contains(filters.reason, autoescape=True))
    if before_id is not None:
        query = query.where(letters.c.id < before_id)
    return [typed(records.DeadLetter, row) for row in conn.execute(query)]


def dead_letter_acted(
    conn: sa.Connection,
    letter_id: int,
    action: str,
    actor: str,
    detail: str,
    status: str,
    key: dict[str, str] | None = None,
) -> None:
    """Record an action on a dead letter, by `actor` with the API key `key` (keys.Principal.acting)."""
    acting = {"key_id": key["id"], "key_name": key["name"]} if key else {}
    conn.execute(
        tables.dead_letter_actions.insert().values(
            dead_letter_id=letter_id, action=action, actor=actor, detail=detail, **acting
        )
    )
    values: dict[str, Any] = {"status": status, "updated_at": sa.func.now()}
    if action == "replay":
        values["replays"] = letters.c.replays + 1
    conn.execute(letters.update().where(letters.c.id == letter_id).values(**values))


def dead_letter_actions(conn: sa.Connection, letter_id: int) -> list[records.DeadLetterAction]:
    actions = tables.dead_letter_actions
    query = (
        sa.select(*columns(actions, records.DeadLetterAction))
        .where(actions.c.dead_letter_id == letter_id)
        .order_by(actions.c.id)
    )
    return [typed(records.DeadLetterAction, row) for row in conn.execute(query)]


DEAD_LETTER_STATUSES = ("dead", "replayed", "discarded")


def dead_letter_counts(conn: sa.Connection) -> dict[str, int]:
    """Recorded dead letters by status (an index-only scan of dead_letters_by_status), for the metrics."""
    counted = conn.execute(sa.select(letters.c.status, sa.func.count()).group_by(letters.c.status)).all()
    return dict.fromkeys(DEAD_LETTER_STATUSES, 0) | {status: count for status, count in counted}
