"""Retention in a stage service's own database and artifact store, on a real PostgreSQL and S3 server.

What outlived its time goes, in bounded batches that skip what others hold; nothing newer, nothing unfinished,
nothing not yet published goes, whatever its age.
"""

from __future__ import annotations

import datetime as dt
import pathlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import artifacts, db, inbox, outbox, retention, settings, tables
from castad_runtime.artifacts import volume
from castad_runtime.stage import machine
from castad_runtime.stage import retention as stage_retention
from castad_runtime.stage.repository import ended

from tests.integration.helpers import (
    count,
    indexes_used,
    pipeline_requested,
    requested_envelope,
    statements_of,
    write_events,
)
from tests.support import waits

pytestmark = pytest.mark.integration

DAY_S = 86_400.0
TTL_S = 10 * DAY_S
OLD = dt.timedelta(days=11)  # older than TTL_S
NEW = dt.timedelta(days=9)  # newer
SONG = events.Stage.SONG


def ago(conn: sa.Connection, age: dt.timedelta) -> dt.datetime:
    """The database's now() less `age`: the clock retention goes by."""
    return conn.execute(sa.select(sa.func.now())).scalar_one() - age


def published_outbox(engine: sa.Engine, n: int, published: dt.timedelta | None, parked: bool = False) -> list[int]:
    """`n` outbox rows created 30 days ago, published `published` ago (None: not yet), parked or not."""
    written = write_events(engine, [pipeline_requested() for _ in range(n)], events.PIPELINE_REQUESTED)
    ids = [env.id for env in written]
    t = tables.outbox
    with db.transaction(engine) as conn:
        old = ago(conn, dt.timedelta(days=30))
        values: dict[str, Any] = {"created_at": old, "parked_at": old if parked else None}
        if published is not None:
            values["published_at"] = ago(conn, published)
        conn.execute(t.update().where(t.c.event_id.in_(ids)).values(**values))
        return list(conn.execute(sa.select(t.c.id).where(t.c.event_id.in_(ids))).scalars())


def outbox_ids(engine: sa.Engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(tables.outbox.c.id)).scalars())


def pruner(*steps: retention.Step, batch: int = 500, max_batch: int = retention.MAX_BATCH) -> retention.Pruner:
    return retention.Pruner(steps, interval_s=60, batch=batch, pause_s=0, max_batch=max_batch)


def test_published_outbox_rows_go_after_their_ttl_and_unpublished_or_parked_ones_never(engines):
    engine = engines["lyric"]
    old = published_outbox(engine, 3, OLD)
    new = published_outbox(engine, 2, NEW)
    waiting = published_outbox(engine, 2, None)  # created 30 days ago, never confirmed
    parked = published_outbox(engine, 1, None, parked=True)
    step = retention.statement_step("outbox", engine, lambda conn, limit: outbox.forget_published(conn, TTL_S, limit))

    removed = pruner(step).run_once()

    assert removed == {"outbox": 3}
    assert outbox_ids(engine) == set(new + waiting + parked)
    assert not set(old) & outbox_ids(engine)


def test_a_row_parked_past_its_ttl_goes_with_the_rows_of_its_pipeline_held_behind_it_and_nothing_else(engines):
    engine = engines["lyric"]
    pipeline_id, other = str(uuid.uuid4()), str(uuid.uuid4())
    requested = [pipeline_requested(pipeline_id) for _ in range(3)] + [pipeline_requested(other) for _ in range(2)]
    written = [env.id for env in write_events(engine, requested, events.PIPELINE_REQUESTED)]
    t = tables.outbox
    with db.transaction(engine) as conn:
        ids = {event_id: row_id for row_id, event_id in conn.execute(sa.select(t.c.id, t.c.event_id))}
        # The pipeline's second row parked long ago, the third held behind it; the other pipeline's first row parked
        # lately, its second held behind it.
        conn.execute(t.update().where(t.c.event_id == written[0]).values(published_at=ago(conn, OLD)))
        conn.execute(t.update().where(t.c.event_id == written[1]).values(parked_at=ago(conn, OLD)))
        conn.execute(t.update().where(t.c.event_id == written[3]).values(parked_at=ago(conn, NEW)))
    step = retention.statement_step("parked", engine, lambda conn, limit: outbox.forget_parked(conn, TTL_S, limit))

    assert pruner(step).run_once() == {"parked": 2}
    assert outbox_ids(engine) == {ids[written[0]], ids[written[3]], ids[written[4]]}


def test_handled_event_ids_go_after_their_ttl_and_newer_ones_stay(engines):
    engine = engines["song"]
    envelopes = [requested_envelope() for _ in range(5)]
    with db.transaction(engine) as conn:
        for env in envelopes:
            assert inbox.first_delivery(conn, env)
        for env, age in zip(envelopes, (OLD, OLD, OLD, NEW, dt.timedelta(0)), strict=True):
            conn.execute(
                tables.inbox.update().where(tables.inbox.c.event_id == env.id).values(received_at=ago(conn, age))
            )
    step = retention.statement_step("inbox", engine, lambda conn, limit: inbox.forget(conn, TTL_S, limit))

    assert pruner(step).run_once() == {"inbox": 3}
    with db.transaction(engine) as conn:
        assert [inbox.first_delivery(conn, env) for env in envelopes] == [True, True, True, False, False]


def add_job(
    engine: sa.Engine, status: str, finished: dt.timedelta | None, *, attempts: int = 2, swept: bool = False
) -> str:
    """A job of a pipeline of its own, `finished` ago (None: not finished), with its attempts.

    Created and last updated 60 days ago whatever its status, so that only its status and end decide.
    """
    pipeline_id = str(uuid.uuid4())
    job_id = uuid.uuid4()
    with db.transaction(engine) as conn:
        long_ago = ago(conn, dt.timedelta(days=60))
        finished_at = None if finished is None else ago(conn, finished)
        conn.execute(
            tables.jobs.insert().values(
                id=job_id,
                pipeline_id=pipeline_id,
                status=status,
                max_attempts=5,
                attempts=attempts,
                due_at=long_ago,
                input=pipeline_requested(pipeline_id).model_dump(mode="json"),
                created_at=long_ago,
                updated_at=long_ago,
                finished_at=finished_at,
                artifacts_swept_at=finished_at + dt.timedelta(days=1) if swept and finished_at else None,
            )
        )
        for number in range(1, attempts + 1):
            conn.execute(
                tables.attempts.insert().values(
                    job_id=job_id, number=number, worker="w", outcome="failed", started_at=long_ago
                )
            )
    return pipeline_id


def jobs_left(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(tables.jobs.c.pipeline_id)).scalars())


FINISHED = [status for status in machine.Status if status.terminal]
UNFINISHED = [status for status in machine.Status if not status.terminal]


def test_finished_jobs_go_with_their_attempts_after_their_ttl_once_their_files_are_gone(engines):
    engine = engines["video"]
    gone = [add_job(engine, status, OLD, swept=True) for status in FINISHED]
    recent = add_job(engine, "SUCCEEDED", NEW, swept=True)
    files_kept = add_job(engine, "SUCCEEDED", OLD, swept=False)  # its files were not deleted yet
    unfinished = [add_job(engine, status, None) for status in UNFINISHED]
    step = retention.statement_step(
        "jobs", engine, lambda conn, limit: ended.forget_finished(conn, TTL_S, limit), rows_each=3
    )

    assert pruner(step).run_once() == {"jobs": 3}

    assert jobs_left(engine) == {recent, files_kept, *unfinished}
    assert not set(gone) & jobs_left(engine)
    assert count(engine, tables.attempts) == 2 * (2 + len(UNFINISHED))  # the deleted jobs' attempts went too


def test_a_job_that_ended_again_after_its_files_were_deleted_keeps_its_new_files_until_their_own_time(engines):
    """A retry reopened a job whose files were deleted; it ended again since: its new end counts."""
    engine = engines["song"]
    pipeline_id = add_job(engine, "FAILED", NEW, swept=False)
    with db.transaction(engine) as conn:
        swept_before_it_ended = ago(conn, NEW + dt.timedelta(days=3))
        conn.execute(tables.jobs.update().values(artifacts_swept_at=swept_before_it_ended))
        assert ended.unswept(conn, TTL_S, 10) == []  # not old enough
        assert [job.pipeline_id for job in ended.unswept(conn, NEW.total_seconds() - 3600, 10)] == [pipeline_id]
    with db.transaction(engine) as conn:  # nor is the job deleted before its new files are
        assert ended.forget_finished(conn, NEW.total_seconds() - 3600, 10) == 0


@pytest.fixture(params=["volume", "s3"])
def store(request, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> artifacts.ArtifactStore:
    """Each artifact store, as the services make it."""
    monkeypatch.setenv("CASTAD_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    if request.param == "s3":
        object_store = request.getfixturevalue("object_store")
        for name, value in object_store.env(request.getfixturevalue("bucket")).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("CASTAD_ARTIFACTS_S3_PREFIX", "media/")
    return artifacts.make_store(settings.StoreSettings())


def keep(store: artifacts.ArtifactStore, pipeline_id: str, stage: events.Stage, content: bytes) -> events.Artifact:
    with store.scratch(pipeline_id, stage, 1, ".bin") as scratch:
        scratch.write_bytes(content)
        return store.keep(scratch, pipeline_id, stage, "application/octet-stream")


def present(
    store: artifacts.ArtifactStore, artifact: events.Artifact, pipeline_id: str, stage: events.Stage = SONG
) -> bool:
    try:
        with store.local_copy(artifact, pipeline_id, stage) as copy:
            return copy.is_file()
    except (artifacts.ArtifactMissing, FileNotFoundError):
        return False


def test_a_stage_deletes_every_file_of_its_finished_jobs_after_their_ttl_and_nothing_else(engines, store):
    engine = engines["song"]
    old, recent = add_job(engine, "SUCCEEDED", OLD), add_job(engine, "SUCCEEDED", NEW)
    failed, running = add_job(engine, "FAILED", OLD), add_job(engine, "RUNNING", None)
    made = {
        pipeline_id: keep(store, pipeline_id, SONG, b"song of " + pipeline_id.encode())
        for pipeline_id in (old, recent, running)
    }
    late = keep(store, old, SONG, b"a late attempt's other song")  # no event names it
    left_by_failure = keep(store, failed, SONG, b"a timed-out attempt's song")
    lyrics = keep(store, old, events.Stage.LYRIC, b"the lyric stage's own file")

    step = retention.Step("files", lambda limit: stage_retention.sweep(engine, store, SONG, TTL_S, limit), 20)
    assert pruner(step).run_once() == {"files": 2}  # the old succeeded and failed jobs

    assert not present(store, made[old], old) and not present(store, late, old)
    assert not present(store, left_by_failure, failed)
    assert present(store, made[recent], recent) and present(store, made[running], running)
    assert present(store, lyrics, old, events.Stage.LYRIC)
    with engine.connect() as conn:
        assert ended.unswept(conn, TTL_S, 10) == []  # marked: not listed again
    jobs_step = retention.statement_step("jobs", engine, lambda conn, limit: ended.forget_finished(conn, TTL_S, limit))
    assert pruner(jobs_step).run_once() == {"jobs": 2}
    assert jobs_left(engine) == {recent, running}


def test_the_video_stage_deletes_the_photos_it_fetched_by_url_with_its_other_files(engines, store):
    engine, video = engines["video"], events.Stage.VIDEO
    old, recent = add_job(engine, "SUCCEEDED", OLD), add_job(engine, "SUCCEEDED", NEW)
    url = "https://photos.example.com/hall.png"
    made = {
        pipeline_id: keep(store, pipeline_id, video, b"video of " + pipeline_id.encode())
        for pipeline_id in (old, recent)
    }
    fetched = {
        pipeline_id: store.keep_fetched(
            b"\x89PNG hall of " + pipeline_id.encode(), pipeline_id, video, url, "image/png"
        )
        for pipeline_id in (old, recent)
    }

    step = retention.Step("files", lambda limit: stage_retention.sweep(engine, store, video, TTL_S, limit), 20)
    assert pruner(step).run_once() == {"files": 1}

    assert not present(store, made[old], old, video) and not present(store, fetched[old], old, video)
    with store.fetched_copy(old, video, url) as found:
        assert found is None  # a retry could not find it either: it is gone, not only unnamed
    assert present(store, made[recent], recent, video) and present(store, fetched[recent], recent, video)


def test_a_run_over_many_rows_deletes_them_in_several_bounded_transactions(engines):
    engine = engines["lyric"]
    published_outbox(engine, 45, OLD)
    batches: list[int] = []
    commits: list[None] = []
    sa.event.listen(engine, "commit", lambda conn: commits.append(None))
    inner = retention.statement_step("outbox", engine, lambda conn, limit: outbox.forget_published(conn, TTL_S, limit))

    def remove(limit: int) -> int:
        batches.append(inner.remove(limit))
        return batches[-1]

    assert pruner(retention.Step("outbox", remove), batch=10, max_batch=20).run_once() == {"outbox": 45}

    assert batches == [10, 20, 15]  # the backlog doubled the batch, up to the most
    assert len(commits) == 3  # each batch committed on its own
    assert outbox_ids(engine) == set()


@pytest.fixture
def held(engines) -> Iterator[sa.Connection]:
    """A connection whose open transaction is about to lock rows (rolled back after the test)."""
    conn = engines["video"].connect()
    conn.begin()
    try:
        yield conn
    finally:
        conn.rollback()
        conn.close()


def test_retention_skips_rows_a_running_transaction_holds_instead_of_waiting_for_them(engines, held, tmp_path):
    engine = engines["video"]
    [locked_row, *_] = published_outbox(engine, 3, OLD)
    locked_job = add_job(engine, "SUCCEEDED", OLD, swept=True)
    add_job(engine, "FAILED", OLD, swept=True)
    held.execute(sa.select(tables.outbox).where(tables.outbox.c.id == locked_row).with_for_update())
    held.execute(sa.select(tables.jobs).where(tables.jobs.c.pipeline_id == locked_job).with_for_update())
    config = settings.CommonSettings(
        CASTAD_RETENTION_OUTBOX_S=TTL_S, CASTAD_RETENTION_JOBS_S=TTL_S, CASTAD_RETENTION_ARTIFACTS_S=TTL_S
    )
    store = volume.VolumeStore(tmp_path)

    started = time.monotonic()
    removed = pruner(*stage_retention.steps(engine, store, events.Stage.VIDEO, config)).run_once()
    took_s = time.monotonic() - started

    # Waiting on a lock would have ended in the lock timeout's error instead.
    assert removed["published outbox rows"] == 2 and removed["finished jobs"] == 1
    assert outbox_ids(engine) == {locked_row}
    assert jobs_left(engine) == {locked_job}
    assert took_s < 5


def test_the_pruner_thread_runs_its_steps_every_interval_until_stopped(engines):
    engine = engines["lyric"]
    published_outbox(engine, 2, OLD)
    step = retention.statement_step("outbox", engine, lambda conn, limit: outbox.forget_published(conn, TTL_S, limit))
    running = retention.Pruner([step], interval_s=0.2, batch=100, pause_s=0)
    running.start()
    try:
        waits.until(lambda: not outbox_ids(engine), what="the first round")
        published_outbox(engine, 1, OLD)  # a later round takes rows that outlived their time since
        waits.until(lambda: not outbox_ids(engine), what="a later round")
    finally:
        running.stop()
    assert not any(thread.is_alive() for thread in running.threads())


def test_every_retention_query_of_a_stage_finds_its_rows_through_an_index(engines, tmp_path):
    """The plans of the statements a stage's retention runs use the indexes made for them.

    Their predicates match the queries', also for a plan prepared without the values.
    """
    engine = engines["lyric"]
    published_outbox(engine, 3, OLD)
    for status in ("SUCCEEDED", "FAILED", "RUNNING"):
        add_job(engine, status, OLD if status != "RUNNING" else None)
    config = settings.CommonSettings(CASTAD_RETENTION_JOBS_S=TTL_S, CASTAD_RETENTION_ARTIFACTS_S=TTL_S)

    with statements_of(engine) as statements:
        pruner(*stage_retention.steps(engine, volume.VolumeStore(tmp_path), events.Stage.LYRIC, config)).run_once()

    assert {"outbox_published", "inbox_received", "jobs_finished", "jobs_unswept"} <= indexes_used(engine, statements)
