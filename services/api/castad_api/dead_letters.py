"""Dead letters where an operator can see, replay and discard them: every statement of the gateway on them.

The dead-letter queue's messages are recorded by dead_letter_recorder.py, each as dead_letter_rows.py describes
it. A replay sends a message back to the queue it came from
(that one alone) through the gateway's outbox, upcast to the newest version of its type the
gateway knows, keeping its producer's source (castad_relay.ownership); a parked row is handed back
to the relay by the service whose outbox holds it. Replaying twice is harmless: the
consumer's inbox makes the effect happen once, as long as it remembers the event, so a
message older than CASTAD_RETENTION_INBOX_S is not sent back (castad_api.retention).
Every replay and discard is an action row (who, when, what) and an entry of its
pipeline's timeline.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Any

import pydantic
import sqlalchemy as sa
from castad_contracts import envelope as envelope_
from castad_contracts import events, ids, topology
from castad_runtime import db, outbox, redact
from sqlalchemy.dialects import postgresql as pg

from castad_api import dead_letter_rows, errors, projection, records, repository, tables
from castad_api.records import columns, typed

if TYPE_CHECKING:  # retention.py runs this module's statements
    from castad_api import retention

SOURCE = topology.SOURCES[topology.GATEWAY]


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
        env = envelope_.Envelope.model_validate(dead_letter_rows.event_document(letter.body))
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
    event_id = uuid.UUID(str(letter.headers[dead_letter_rows.PARKED_HEADER]))
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


# -- Retention's (retention.py) -----------------------------------------------------------------------------------


def forget_settled(conn: sa.Connection, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` dead letters dealt with more than `older_than_s` ago; how many.

    Dead letters replayed or discarded go with their actions; one still dead goes by `forget_left`.
    """
    settled = sa.select(letters.c.id).where(sa.text(tables.SETTLED_LETTER))
    return _forget(conn, list(conn.execute(db.expired(settled, letters.c.updated_at, older_than_s, limit)).scalars()))


def forget_left(conn: sa.Connection, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` dead letters still dead that came more than `older_than_s` ago, with their actions."""
    left = sa.select(letters.c.id).where(letters.c.status == "dead")
    return _forget(conn, list(conn.execute(db.expired(left, letters.c.received_at, older_than_s, limit)).scalars()))


def _forget(conn: sa.Connection, ids: list[int]) -> int:
    if ids:
        conn.execute(tables.dead_letter_actions.delete().where(tables.dead_letter_actions.c.dead_letter_id.in_(ids)))
        conn.execute(letters.delete().where(letters.c.id.in_(ids)))
    return len(ids)
