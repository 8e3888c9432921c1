"""Exactly-once effects under redelivery: the inbox, alone and behind a real Dramatiq consumer.

Through the broker, the same envelope is published twice to the topic exchange (what the
relay does when a confirm is lost) and consumed by the service's EventConsumer in a
Dramatiq worker. Directly, two deliveries of one event race in two transactions.
"""

from __future__ import annotations

import concurrent.futures
import threading
import uuid

import pytest
import sqlalchemy as sa
from castad_api import creation, projection
from castad_api import tables as api_tables
from castad_contracts import api, envelope, events
from castad_runtime import db, inbox, outbox, tables

from tests.integration.helpers import (
    Counted,
    count,
    lyric_started,
    now,
    requested_envelope,
    stage_trigger_handler,
)
from tests.support import waits

pytestmark = pytest.mark.integration


class Boom(Exception):
    pass


def handle(
    engine: sa.Engine,
    env: envelope.Envelope,
    inside: threading.Event | None = None,
    proceed: threading.Event | None = None,
    fail: bool = False,
) -> bool:
    """A handler whose effect is not idempotent by itself (it emits a new event): only the inbox guards it.

    `inside` is set once the inbox row is written, then the transaction waits for `proceed`.
    """
    with db.transaction(engine) as conn:
        first = inbox.first_delivery(conn, env)
        if inside is not None and proceed is not None:
            inside.set()
            assert proceed.wait(timeout=10)
        if first:
            outbox.add(conn, lyric_started(env.subject, 1), "lyric.started", "/castad/lyric")
        if fail:
            raise Boom()
    return first


def waiting_for_a_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_two_concurrent_deliveries_of_one_event_take_effect_once(engines, first_commits):
    """The second delivery waits on the first one's inbox row.

    If the first commits, the second is a duplicate; if the first rolls back, the second is the first delivery.
    Either way one effect.
    """
    engine = engines["lyric"]
    env = requested_envelope()
    inside, proceed = threading.Event(), threading.Event()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(handle, engine, env, inside, proceed, fail=not first_commits)
        assert inside.wait(timeout=10)
        second = pool.submit(handle, engine, env)
        try:
            waits.until(lambda: waiting_for_a_lock(engine), what="the second delivery blocked by the first")
        finally:
            proceed.set()
        assert second.result(timeout=10) is not first_commits
        if first_commits:
            assert first.result(timeout=10) is True
        else:
            with pytest.raises(Boom):
                first.result(timeout=10)

    assert count(engine, tables.outbox, tables.outbox.c.pipeline_id == env.subject) == 1
    assert count(engine, tables.inbox, tables.inbox.c.event_id == env.id) == 1


def test_the_inbox_says_first_delivery_once_per_event_id(engines):
    """Sequential redeliveries are duplicates; another event of the same pipeline is not."""
    engine = engines["lyric"]
    env = requested_envelope()
    other = requested_envelope(env.subject)

    assert [handle(engine, env), handle(engine, env), handle(engine, other), handle(engine, env)] == [
        True,
        False,
        True,
        False,
    ]
    assert count(engine, tables.outbox, tables.outbox.c.pipeline_id == env.subject) == 2


def test_a_step_read_first_sees_what_it_read_once_and_a_duplicate_only_reads(engines):
    """once_read_first: the step gets what `read` found; a duplicate runs `read` but not the step."""
    engine = engines["lyric"]
    env = requested_envelope()
    steps: list[int] = []

    def read(conn: sa.Connection) -> int:
        return db.run(conn, "SELECT count(*) AS n FROM outbox WHERE pipeline_id = %s", (env.subject,)).fetchone().n

    def step(conn: sa.Connection, found: int) -> int:
        outbox.add(conn, lyric_started(env.subject, 1), "lyric.started", "/castad/lyric")
        steps.append(found)
        return found + 1

    assert inbox.once_read_first(engine, env, read, step) == 1
    assert inbox.once_read_first(engine, env, read, step) is None
    assert steps == [0]
    assert count(engine, tables.outbox, tables.outbox.c.pipeline_id == env.subject) == 1


def test_a_sqlalchemy_statement_in_a_pipelined_block_is_refused_and_nothing_is_kept(engines):
    """SQLAlchemy would read a rowcount or rows that pipeline mode has not received yet.

    Refused loudly, and the transaction (the inbox row with it) rolled back, so that the event is handled again.
    """
    engine = engines["lyric"]
    env = requested_envelope()

    def step(conn: sa.Connection, found: None) -> None:
        conn.execute(tables.jobs.update().where(tables.jobs.c.pipeline_id == env.subject).values(attempts=1))

    with pytest.raises(RuntimeError, match="pipelined"):
        inbox.once_read_first(engine, env, lambda conn: None, step)
    assert count(engine, tables.inbox, tables.inbox.c.event_id == env.id) == 0


def publish_twice(amqp, installation, env: envelope.Envelope) -> None:
    body = env.to_json()
    for _ in range(2):
        amqp.publish(installation.topology.exchange, env.type, body, message_id=str(env.id))


def test_a_redelivered_trigger_creates_one_job(installation, engines, amqp, run_consumer):
    """pipeline.requested delivered twice to the lyric stage.

    Both deliveries are handled, one job and one inbox row result.
    """
    engine = engines["lyric"]
    handler = Counted(stage_trigger_handler(engine))
    run_consumer("lyric", {events.PIPELINE_REQUESTED: handler})
    env = requested_envelope()

    publish_twice(amqp, installation, env)
    waits.until(lambda: handler.finished == 2, what="both deliveries handled")

    assert count(engine, tables.jobs, tables.jobs.c.pipeline_id == env.subject) == 1
    assert count(engine, tables.inbox, tables.inbox.c.event_id == env.id) == 1
    assert amqp.depth(installation.topology.queue("lyric")) == 0


def test_a_handler_that_fails_before_commit_takes_effect_on_redelivery(installation, engines, amqp, run_consumer):
    """The inbox row is written in the handler's transaction.

    When that transaction fails (here on a lost connection, an outage), the retry is not mistaken for a duplicate
    and creates the job (once), so no delivery is lost.
    """
    engine = engines["lyric"]
    handler = Counted(stage_trigger_handler(engine, fail_first=True))
    run_consumer("lyric", {events.PIPELINE_REQUESTED: handler})
    env = requested_envelope()

    amqp.publish(installation.topology.exchange, env.type, env.to_json(), message_id=str(env.id))
    waits.until(lambda: handler.finished == 2, what="the delivery and its retry handled")

    assert count(engine, tables.jobs, tables.jobs.c.pipeline_id == env.subject) == 1
    assert count(engine, tables.inbox, tables.inbox.c.event_id == env.id) == 1


def test_a_redelivered_stage_event_changes_the_gateways_projection_once(installation, engines, amqp, run_consumer):
    """lyric.started delivered twice to the gateway: the stage, pipeline and timeline change once."""
    engine = engines["api"]
    with db.transaction(engine) as conn:
        accepted = creation.create(
            conn, api.PipelineRequest(customer_name="Cafe Blue", region="Busan"), "tests", "key-1", 3600
        )
    handler = Counted(lambda env, payload: projection.apply(engine, env, payload))
    run_consumer("api", {"lyric.started": handler})
    started = events.StageStarted(
        pipeline_id=str(accepted.pipeline_id),
        stage=events.Stage.LYRIC,
        job_id=str(uuid.uuid4()),
        attempt=1,
        started_at=now(),
        worker="lyric@test:1",
    )
    env = envelope.wrap(started, "lyric.started", "/castad/lyric")

    publish_twice(amqp, installation, env)
    waits.until(lambda: handler.finished == 2, what="both deliveries handled")

    pipeline_id = accepted.pipeline_id
    timeline = api_tables.timeline
    assert [row.event_type for row in _timeline(engine, pipeline_id)] == ["pipeline.requested", "lyric.started"]
    assert count(engine, timeline, timeline.c.event_id == env.id) == 1
    with engine.connect() as conn:
        stage = conn.execute(sa.select(api_tables.stages).where(api_tables.stages.c.pipeline_id == pipeline_id)).one()
        pipeline = conn.execute(sa.select(api_tables.pipelines).where(api_tables.pipelines.c.id == pipeline_id)).one()
    assert (stage.stage, stage.status, stage.attempt) == ("lyric", "RUNNING", 1)
    assert (pipeline.status, pipeline.current_stage) == ("RUNNING", "lyric")


def _timeline(engine: sa.Engine, pipeline_id: uuid.UUID) -> list[sa.Row]:
    timeline = api_tables.timeline
    with engine.connect() as conn:
        return list(
            conn.execute(sa.select(timeline).where(timeline.c.pipeline_id == pipeline_id).order_by(timeline.c.seq))
        )
