"""The gateway's projection of events that come together, in one transaction for all.

castad_api.projection.apply_all and Projector make the same read model, timeline and webhooks as the same events
projected one by one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from castad_api import projection, settings, tables, timeline_rows
from castad_contracts import events
from castad_runtime import groups
from castad_runtime import tables as runtime_tables

from tests.integration.gateway import Projection, ago
from tests.support import waits

pytestmark = pytest.mark.integration

LYRIC, SONG, VIDEO = events.STAGE_ORDER
Story = Callable[[Projection, str, dt.datetime], None]


def succeeds_with_a_duplicate_and_a_late_start(gateway: Projection, pipeline_id: str, now: dt.datetime) -> None:
    lyric_done = None
    for number, stage in enumerate((LYRIC, SONG, VIDEO)):
        start = now - dt.timedelta(seconds=60 - 10 * number)
        gateway.event(pipeline_id, stage, "started", 1, start, worker=f"{stage.value}@w")
        done = gateway.event(pipeline_id, stage, "completed", 1, start + dt.timedelta(seconds=2))
        lyric_done = lyric_done or done
    assert lyric_done is not None
    gateway.deliver(lyric_done)  # delivered twice
    gateway.event(
        pipeline_id, SONG, "started", 1, now - dt.timedelta(seconds=45), worker="song@late"
    )  # after its completion


def retries_then_fails_for_good(gateway: Projection, pipeline_id: str, now: dt.datetime) -> None:
    gateway.event(pipeline_id, LYRIC, "started", 1, now - dt.timedelta(seconds=30))
    gateway.event(pipeline_id, LYRIC, "retrying", 1, now - dt.timedelta(seconds=29), code="provider_timeout")
    gateway.event(pipeline_id, LYRIC, "started", 2, now - dt.timedelta(seconds=28))
    gateway.event(pipeline_id, LYRIC, "completed", 2, now - dt.timedelta(seconds=27))
    gateway.event(pipeline_id, SONG, "started", 1, now - dt.timedelta(seconds=26))
    gateway.event(pipeline_id, SONG, "failed", 1, now - dt.timedelta(seconds=25), code="content_refused")


def fails_before_the_completion_it_follows_arrives(gateway: Projection, pipeline_id: str, now: dt.datetime) -> None:
    gateway.event(pipeline_id, LYRIC, "started", 1, now - dt.timedelta(seconds=30))
    gateway.event(pipeline_id, SONG, "started", 1, now - dt.timedelta(seconds=20))
    gateway.event(pipeline_id, SONG, "failed", 1, now - dt.timedelta(seconds=19), code="content_refused")
    gateway.event(pipeline_id, LYRIC, "completed", 1, now - dt.timedelta(seconds=21))


def canceled_while_its_attempt_ran_which_then_reports_its_end(
    gateway: Projection, pipeline_id: str, now: dt.datetime
) -> None:
    gateway.cancel(pipeline_id)  # the operator's request, before any event of the group
    gateway.event(pipeline_id, LYRIC, "started", 1, now - dt.timedelta(seconds=30), worker="lyric@w")
    gateway.event(pipeline_id, LYRIC, "canceled", 1, now - dt.timedelta(seconds=29), operation=1)
    gateway.event(pipeline_id, LYRIC, "failed", 1, now - dt.timedelta(seconds=28), code="provider_error")
    gateway.event(pipeline_id, LYRIC, "started", 1, now - dt.timedelta(seconds=30), worker="lyric@late")


def own(event_type: str) -> str | None:
    return "<now>" if event_type.startswith("pipeline.") else None


def projected(gateway: Projection, pipeline_id: str) -> dict[str, Any]:
    """What the gateway shows of a pipeline, with its id and the times the gateway itself set left out."""
    key = uuid.UUID(pipeline_id)
    with gateway.engine.connect() as conn:
        p = tables.pipelines
        pipeline = conn.execute(
            sa.select(
                p.c.status,
                p.c.progress,
                p.c.current_stage,
                p.c.error_code,
                p.c.error_message,
                p.c.finished_at.is_(None),
            ).where(p.c.id == key)
        ).one()
        s, a, t = tables.stages, tables.attempts, tables.timeline
        stages = conn.execute(
            sa.select(*(c for c in s.c if c.name != "pipeline_id")).where(s.c.pipeline_id == key).order_by(s.c.stage)
        ).all()
        attempts = conn.execute(
            sa.select(*(c for c in a.c if c.name not in ("pipeline_id", "id")))
            .where(a.c.pipeline_id == key)
            .order_by(a.c.stage, a.c.attempt)
        ).all()
        timeline = conn.execute(
            sa.select(t.c.event_type, t.c.data, t.c.occurred_at).where(t.c.pipeline_id == key).order_by(t.c.seq)
        ).all()
        webhooks = conn.execute(
            sa.select(sa.func.count()).where(tables.webhook_deliveries.c.pipeline_id == key)
        ).scalar_one()
    shown = {
        "pipeline": tuple(pipeline),
        "stages": [tuple(row) for row in stages],
        "attempts": [tuple(row) for row in attempts],
        "timeline": [  # in seq order; the gateway's own entries (the operator's requests) at the gateway's own time
            (row.event_type, json.dumps(row.data, sort_keys=True), own(row.event_type) or row.occurred_at)
            for row in timeline[1:]
        ],
        "requested first": timeline[0].event_type,
        "webhooks": webhooks,
    }
    return json.loads(json.dumps(shown, default=str).replace(pipeline_id, "<pipeline>"))


@pytest.mark.parametrize(
    "story",
    [
        succeeds_with_a_duplicate_and_a_late_start,
        retries_then_fails_for_good,
        fails_before_the_completion_it_follows_arrives,
        canceled_while_its_attempt_ran_which_then_reports_its_end,
    ],
)
def test_events_projected_together_show_what_they_show_projected_one_by_one(gateway: Projection, story: Story):
    now = ago(seconds=0)
    one_by_one = gateway.create(callback_url="https://hooks.example.com/castad")
    story(gateway, one_by_one, now)
    together = gateway.create(callback_url="https://hooks.example.com/castad")
    with gateway.together():
        story(gateway, together, now)
    assert projected(gateway, together) == projected(gateway, one_by_one)


def test_events_of_several_pipelines_and_unknown_ones_are_projected_together(gateway: Projection):
    first, second = gateway.create(), gateway.create()
    unknown = str(uuid.uuid4())
    with gateway.together():
        for pipeline_id in (second, unknown, first):
            gateway.event(pipeline_id, LYRIC, "started", 1, ago(seconds=2))
            gateway.event(pipeline_id, LYRIC, "completed", 1, ago(seconds=1))
    with gateway.engine.connect() as conn:
        p = tables.pipelines
        rows = conn.execute(sa.select(p.c.id, p.c.progress).where(p.c.id.in_([uuid.UUID(first), uuid.UUID(second)])))
        assert {str(row.id): row.progress for row in rows} == {first: 33, second: 33}
        inbox = runtime_tables.inbox
        recorded = conn.execute(sa.select(sa.func.count()).where(inbox.c.pipeline_id == unknown)).scalar_one()
    assert recorded == 2  # taken once each, and never projected


def test_a_group_waits_for_no_lock_and_leaves_the_events_of_a_held_pipeline_to_their_own_threads(
    gateway: Projection,
):
    held, free = gateway.create(), gateway.create()
    holder = hold(gateway.engine, [held])
    p = tables.pipelines
    try:
        envs = [gateway.envelope(pipeline_id, LYRIC, "started", 1, ago(seconds=1)) for pipeline_id in (held, free)]
        results = projection.apply_all(gateway.engine, [(env, env.payload()) for env in envs])
    finally:
        holder.rollback()
        holder.close()
    assert results == [groups.ALONE, None]
    inbox = runtime_tables.inbox
    with gateway.engine.connect() as conn:
        recorded = set(
            conn.execute(sa.select(inbox.c.event_id).where(inbox.c.event_id.in_([e.id for e in envs]))).scalars()
        )
        statuses = dict(
            conn.execute(sa.select(p.c.id, p.c.status).where(p.c.id.in_([uuid.UUID(held), uuid.UUID(free)]))).all()
        )
    assert recorded == {envs[1].id}  # the held pipeline's event comes again, in its own thread: not a duplicate
    assert statuses == {uuid.UUID(held): "PENDING", uuid.UUID(free): "RUNNING"}
    projection.apply(gateway.engine, envs[0], envs[0].payload())
    assert projected(gateway, held)["pipeline"][0] == "RUNNING"


def test_the_projector_projects_the_events_that_came_while_it_was_busy_in_one_transaction(gateway: Projection):
    """A transaction holds the pipeline.

    The first event waits for it, the next ones wait for that one, then go together (their inbox rows have one
    transaction time).
    """
    pipeline_id = gateway.create()
    projector = projection.Projector(gateway.engine)
    holder = hold(gateway.engine, [pipeline_id])
    p = tables.pipelines
    facts = [(LYRIC, "started"), (LYRIC, "completed"), (SONG, "started"), (SONG, "completed")]
    envs = [gateway.envelope(pipeline_id, stage, fact, 1, ago(seconds=10)) for stage, fact in facts]
    threads = [threading.Thread(target=projector.apply, args=(env, env.payload())) for env in envs]
    threads[0].start()
    waits.until(lambda: waiting_for_a_lock(gateway.engine), what="the first event waiting for the pipeline")
    for thread in threads[1:]:
        thread.start()
    waits.until(lambda: len(projector._groups._waiting) == 3, what="the others waiting for the first")
    holder.commit()
    holder.close()
    for thread in threads:
        thread.join(10)
    inbox = runtime_tables.inbox
    with gateway.engine.connect() as conn:
        times = conn.execute(
            sa.select(inbox.c.event_id, inbox.c.received_at).where(inbox.c.pipeline_id == pipeline_id)
        ).all()
        progress = conn.execute(sa.select(p.c.progress).where(p.c.id == uuid.UUID(pipeline_id))).scalar_one()
    received = {row.event_id: row.received_at for row in times}
    assert len({received[env.id] for env in envs[1:]}) == 1  # one transaction for the three
    assert received[envs[0].id] != received[envs[1].id]
    assert progress == 67


def test_while_one_pipeline_s_transaction_waits_another_pipeline_s_events_are_projected(gateway: Projection):
    """Two transactions under way at once.

    The held pipeline's first event waits in one, its next one waits for it (never two transactions with one
    pipeline's events), another pipeline's event goes in the other.
    """
    held_id, free_id = gateway.create(), gateway.create()
    projector = projection.Projector(gateway.engine)
    holder = hold(gateway.engine, [held_id])
    p = tables.pipelines
    held = [gateway.envelope(held_id, LYRIC, fact, 1, ago(seconds=10)) for fact in ("started", "completed")]
    free = gateway.envelope(free_id, LYRIC, "started", 1, ago(seconds=10))
    threads = [threading.Thread(target=projector.apply, args=(env, env.payload())) for env in [*held, free]]
    threads[0].start()
    waits.until(lambda: waiting_for_a_lock(gateway.engine), what="the held pipeline's first event waiting")
    threads[1].start()
    waits.until(lambda: len(projector._groups._waiting) == 1, what="its next event waiting for it")
    threads[2].start()
    threads[2].join(10)
    with gateway.engine.connect() as conn:
        statuses = dict(conn.execute(sa.select(p.c.id, p.c.status)).all())
    assert statuses[uuid.UUID(free_id)] == "RUNNING"  # projected while the other transaction waited
    assert statuses[uuid.UUID(held_id)] == "PENDING"
    holder.commit()
    holder.close()
    for thread in threads[:2]:
        thread.join(10)
    with gateway.engine.connect() as conn:
        progress = conn.execute(sa.select(p.c.progress).where(p.c.id == uuid.UUID(held_id))).scalar_one()
    assert progress == 33  # both of its events, once the holder let go


def test_the_consumer_s_threads_outnumber_the_projection_s_connections_and_every_event_is_projected(
    gateway: Projection,
):
    """More consumer threads than projection connections still get every event projected.

    As many events at once as the gateway's consumer has threads, a group of all but two of them, every one of its
    pipelines held by another transaction: the group leaves them to their own threads, which queue for the
    projection's few connections instead of each opening one, and all are projected once the holder lets go.
    """
    threads_count = settings.ApiSettings.model_fields["consumer_threads"].default
    every_connection = 2 * projection.POOL_SIZE  # the pool and its overflow
    assert threads_count - 2 > every_connection  # the case this test is about
    pipeline_ids = [gateway.create() for _ in range(threads_count)]
    projecting = projection.make_engine(gateway.engine.url.render_as_string(hide_password=False))
    projector = projection.Projector(projecting)
    envs = [gateway.envelope(pipeline_id, LYRIC, "started", 1, ago(seconds=10)) for pipeline_id in pipeline_ids]
    threads = [threading.Thread(target=projector.apply, args=(env, env.payload())) for env in envs]
    first, rest = hold(gateway.engine, pipeline_ids[:2]), hold(gateway.engine, pipeline_ids[2:])
    try:
        for count, thread in enumerate(threads[:2], start=1):  # two groups of one under way, each waiting
            thread.start()
            waits.until(lambda count=count: waiting_for_a_lock(gateway.engine) == count, what=f"{count} waiting")
        for thread in threads[2:]:
            thread.start()
        waits.until(lambda: len(projector._groups._waiting) == threads_count - 2, what="the others waiting")
        first.rollback()  # the two go; the others make one group, which leaves each to its own thread
        waits.until(lambda: waiting_for_a_lock(gateway.engine) == every_connection, what="every connection waiting")
        assert projecting.pool.checkedout() == every_connection  # the other threads wait for one
    finally:
        for holder in (first, rest):
            holder.rollback()
            holder.close()
        for thread in threads:
            thread.join(20)
        projecting.dispose()
    assert not any(thread.is_alive() for thread in threads)
    p = tables.pipelines
    with gateway.engine.connect() as conn:
        statuses = conn.execute(sa.select(p.c.status).where(p.c.id.in_([uuid.UUID(i) for i in pipeline_ids])))
        assert list(statuses.scalars()) == ["RUNNING"] * threads_count


def hold(engine: sa.Engine, pipeline_ids: list[str]) -> sa.Connection:
    """A connection whose transaction holds these pipelines' rows until it ends."""
    holder = engine.connect()
    holder.begin()
    p = tables.pipelines
    holder.execute(sa.select(p.c.id).where(p.c.id.in_([uuid.UUID(i) for i in pipeline_ids])).with_for_update())
    return holder


def waiting_for_a_lock(engine: sa.Engine) -> int:
    """How many sessions of the database wait for a lock."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


@pytest.mark.parametrize("together", [False, True], ids=["one by one", "together"])
def test_a_start_that_comes_after_its_completion_gives_the_stage_its_start_but_not_its_status(
    gateway: Projection, together: bool
):
    """The consumer's threads may project a stage's `completed` before its `started`.

    The stage stays SUCCEEDED and gets the start the late event tells (its row and its attempt's), so the stage is
    timed.
    """
    now = ago(seconds=0)
    started, completed = now - dt.timedelta(seconds=5), now - dt.timedelta(seconds=4)
    pipeline_id = gateway.create()
    with gateway.together() if together else contextlib.nullcontext():
        gateway.event(pipeline_id, LYRIC, "completed", 1, completed)
        gateway.event(pipeline_id, LYRIC, "started", 1, started, worker="lyric@late")
    s, a = tables.stages, tables.attempts
    key = uuid.UUID(pipeline_id)
    with gateway.engine.connect() as conn:
        stage = conn.execute(sa.select(s).where(s.c.pipeline_id == key, s.c.stage == LYRIC.value)).one()
        attempt = conn.execute(sa.select(a).where(a.c.pipeline_id == key, a.c.stage == LYRIC.value)).one()
    assert (stage.status, stage.rank, stage.attempt) == ("SUCCEEDED", 2, 1)
    assert stage.started_at == stage.first_started_at == started
    assert stage.finished_at == completed
    assert (attempt.started_at, attempt.ended_at, attempt.worker) == (started, completed, "lyric@late")


def test_the_entries_a_group_writes_wake_the_event_streams_of_their_pipelines(gateway: Projection):
    """A group's timeline entries are written by one statement of its own, not append_timeline.

    Each of their pipelines is woken too, once the group committed.
    """
    first, second = gateway.create(), gateway.create()
    url = gateway.engine.url.render_as_string(hide_password=False)
    listener = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1), autocommit=True)
    with listener:
        listener.execute(f"LISTEN {timeline_rows.PIPELINE_EVENTS_CHANNEL}")
        envs = [gateway.envelope(pipeline_id, LYRIC, "started", 1, ago(seconds=1)) for pipeline_id in (first, second)]
        assert projection.apply_all(gateway.engine, [(env, env.payload()) for env in envs]) == [None, None]
        heard = {notice.payload for notice in listener.notifies(timeout=5, stop_after=2)}
    assert heard == {first, second}
