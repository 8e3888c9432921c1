"""A consumer whose database goes away, and events of a schema version it does not know yet.

An outage is the machinery's failure, never the message's: nothing is dead-lettered or used
up, and every message takes effect once the database is back. An event newer than the
consumer (its producer was upgraded first) waits for the consumer's own upgrade; an older
one (the consumer was upgraded first) is read as the newer model.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa
from castad_contracts import envelope, events
from castad_faults import outage
from castad_runtime import outages, tables

from tests.integration.helpers import (
    Counted,
    count,
    pipeline_requested,
    requested_envelope,
    stage_trigger_handler,
)
from tests.integration.test_dead_letters import recorded
from tests.support import waits

pytestmark = pytest.mark.integration


NEXT = events.REGISTRY.current_version(events.PIPELINE_REQUESTED) + 1


class RequestedNext(events.PipelineRequested):
    """pipeline.requested as a later release writes it (the version after the newest known here)."""

    channel: str


def upgraded_registry() -> events.Registry:
    registry = events.REGISTRY.copy()
    registry.register(events.PIPELINE_REQUESTED, NEXT, RequestedNext, lambda data: {**data, "channel": "web"})
    return registry


def requested_next(pipeline_id: str | None = None) -> envelope.Envelope:
    payload = RequestedNext(**pipeline_requested(pipeline_id).model_dump(), channel="kiosk")
    return envelope.Envelope(
        source="/castad/api",
        type=events.PIPELINE_REQUESTED,
        subject=payload.pipeline_id,
        schemaversion=NEXT,
        data=payload.model_dump(mode="json"),
    )


def publish(amqp, installation, env: envelope.Envelope) -> None:
    amqp.publish(installation.topology.exchange, env.type, env.to_json(), message_id=str(env.id))


def _end_session(database_url: str, pid: int) -> None:
    """End the session `pid` of the database from another connection; returns once it is gone."""
    # In autocommit: a transaction reads pg_stat_activity once, and would see the session there for ever.
    looking = sa.create_engine(database_url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with looking.connect() as other:
            other.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            waits.until(
                lambda: not other.execute(sa.text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).all(),
                what=f"session {pid} ended",
            )
    finally:
        looking.dispose()


def _pooled_session(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()


def test_a_pooled_connection_the_server_ended_is_replaced_before_use_with_no_ping(installation, engines):
    """A pool looks at a connection's socket before handing it out (no `SELECT 1`).

    The server's goodbye to a session it ended makes it readable, and the connection is replaced instead of failing
    the work.
    """
    engine = engines["lyric"]
    ended = _pooled_session(engine)
    _end_session(installation.database_urls["lyric"], ended)

    assert _pooled_session(engine) != ended
    assert engine.pool.checkedin() == 1


def test_a_replacement_ended_before_its_first_use_fails_as_an_outage(installation, engines):
    """A replacement connection ended before its first use fails that use as an outage.

    The replacement of an ended connection is not looked at (SQLAlchemy tries a checkout twice, and a second
    refusal raises an error that is no outage's): ended too, it fails its first statement as an outage, which
    nothing counts against the work, and the pool replaces it for the next.
    """
    engine, url = engines["song"], installation.database_urls["song"]
    _end_session(url, _pooled_session(engine))

    def end_at_once(dbapi_connection: Any, record: Any) -> None:
        _end_session(url, dbapi_connection.info.backend_pid)

    sa.event.listen(engine, "connect", end_at_once, once=True)

    with pytest.raises(sa.exc.OperationalError) as raised, engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
    assert outages.is_outage(raised.value)
    assert _pooled_session(engine)


def test_a_database_outage_uses_up_no_message_and_each_takes_effect_once_it_is_back(
    installation, engines, amqp, run_consumer
):
    """With max_retries=2 a failing handler is dead-lettered after three tries, well under a second.

    An outage of several seconds must not count as such failures.
    """
    engine = engines["lyric"]
    handler = Counted(stage_trigger_handler(engine))
    run_consumer("lyric", {events.PIPELINE_REQUESTED: handler}, threads=2, max_retries=2)
    sent = [requested_envelope() for _ in range(4)]

    with outage.database_down(installation.database_urls["lyric"]):
        for env in sent:
            publish(amqp, installation, env)
        waits.until(lambda: handler.finished >= 6, what="handlers failing on the outage, again and again")
        time.sleep(2)
        assert amqp.depth(installation.topology.dead_letter_queue) == 0

    waits.until(lambda: count(engine, tables.jobs) == len(sent), timeout_s=30, what="a job per message")
    assert count(engine, tables.inbox) == len(sent)
    for queue in (installation.topology.queue("lyric"), installation.topology.dead_letter_queue):
        assert amqp.depth(queue) == 0, queue


def test_a_message_held_through_a_long_outage_is_handed_back_as_a_copy_and_takes_effect_once_it_is_back(
    installation, engines, amqp, run_consumer, caplog
):
    """A consumer waiting out a long outage hands its message back through the delay queue as a copy.

    RabbitMQ takes back a delivery left unacknowledged past its consumer_timeout, and each return brings a message
    nearer its queue's delivery limit: the consumer hands the message back (a copy, which counts no return) and
    waits on from there.
    """
    engine = engines["lyric"]
    handler = Counted(stage_trigger_handler(engine))
    run_consumer("lyric", {events.PIPELINE_REQUESTED: handler}, threads=1, hand_back_after_s=1.0)
    sent = requested_envelope()

    with outage.database_down(installation.database_urls["lyric"]):
        publish(amqp, installation, sent)
        waits.until(lambda: "handed back through the delay queue" in caplog.text, what="the message handed back")

    waits.until(lambda: count(engine, tables.jobs) == 1, timeout_s=30, what="its job, once the database is back")
    assert count(engine, tables.inbox) == 1
    for queue in (installation.topology.queue("lyric"), installation.topology.dead_letter_queue):
        assert amqp.depth(queue) == 0, queue


def test_a_worker_stopped_during_an_outage_leaves_its_message_in_the_queue(installation, engines, amqp, run_consumer):
    engine = engines["lyric"]
    handler = Counted(stage_trigger_handler(engine))
    run_consumer("lyric", {events.PIPELINE_REQUESTED: handler}, threads=1)
    env = requested_envelope()
    queue = installation.topology.queue("lyric")

    with outage.database_down(installation.database_urls["lyric"]):
        publish(amqp, installation, env)
        waits.until(lambda: handler.finished >= 2, what="the handler failing on the outage")
        run_consumer.stop()
        assert amqp.depth(queue) == 1
        assert amqp.depth(installation.topology.dead_letter_queue) == 0

    run_consumer("lyric", {events.PIPELINE_REQUESTED: stage_trigger_handler(engine)}, threads=1)
    waits.until(lambda: count(engine, tables.jobs, tables.jobs.c.pipeline_id == env.subject) == 1, timeout_s=15)
    assert amqp.depth(installation.topology.dead_letter_queue) == 0


def test_an_event_newer_than_its_consumer_waits_for_the_consumers_upgrade(installation, engines, amqp, run_consumer):
    """Producer upgraded first.

    The old consumer holds the newer event instead of dead-lettering it; the upgraded consumer that replaces it
    handles it.
    """
    engine = engines["lyric"]
    old = Counted(stage_trigger_handler(engine))
    run_consumer("lyric", {events.PIPELINE_REQUESTED: old}, threads=1, hold_s=120)
    env = requested_next()

    publish(amqp, installation, env)
    time.sleep(3)
    assert old.finished == 0
    assert amqp.depth(installation.topology.dead_letter_queue) == 0
    run_consumer.stop()

    seen: list[events.Payload] = []
    handler = stage_trigger_handler(engine)

    def upgraded(env: envelope.Envelope, payload: events.Payload) -> None:
        seen.append(payload)
        handler(env, payload)

    run_consumer("lyric", {events.PIPELINE_REQUESTED: upgraded}, threads=1, registry=upgraded_registry())
    waits.until(lambda: count(engine, tables.jobs, tables.jobs.c.pipeline_id == env.subject) == 1, timeout_s=30)
    assert [(type(p), getattr(p, "channel", None)) for p in seen] == [(RequestedNext, "kiosk")]
    assert amqp.depth(installation.topology.dead_letter_queue) == 0


def test_an_older_event_is_read_by_an_upgraded_consumer_as_the_newer_model(installation, engines, amqp, run_consumer):
    """Consumer upgraded first: events of the older version still sent by the old producer are upcast."""
    seen: list[events.Payload] = []
    handler = stage_trigger_handler(engines["lyric"])

    def upgraded(env: envelope.Envelope, payload: events.Payload) -> None:
        seen.append(payload)
        handler(env, payload)

    run_consumer("lyric", {events.PIPELINE_REQUESTED: upgraded}, threads=1, registry=upgraded_registry())
    env = requested_envelope()
    publish(amqp, installation, env)

    waits.until(lambda: len(seen) == 1)
    assert isinstance(seen[0], RequestedNext) and seen[0].channel == "web"
    assert seen[0].pipeline_id == env.subject


def test_an_event_still_newer_after_the_hold_is_dead_lettered_with_the_reason(installation, amqp, run_consumer):
    run_consumer("lyric", {events.PIPELINE_REQUESTED: lambda env, payload: None}, threads=1, hold_s=2)
    env = requested_next()

    publish(amqp, installation, env)

    [parked] = [recorded(message) for message in amqp.take(installation.topology.dead_letter_queue, 1, timeout=20)]
    reason = parked["reason"]
    assert reason.startswith(
        f"pipeline.requested version {NEXT} is newer than {NEXT - 1}, the newest known here; held "
    )
    assert reason.endswith(" s")
    assert parked["event_id"] == env.id
