"""The gateway's retention on a real PostgreSQL.

Timelines, pipelines, dead letters and creation counts go after their time, nothing of a pipeline that has not
ended goes, and the HTTP API refuses (409, 410) what the stages' retention deleted or would delete before it could
be used; and a download serves a stage's file only from its own pipeline's and stage's place in the store, whatever
its event names.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from castad_api import (
    app,
    creation,
    dead_letter_rows,
    dead_letters,
    deps,
    keys,
    notifications,
    projection,
    repository,
    tables,
)
from castad_api import retention as api_retention
from castad_api import settings as api_settings
from castad_contracts import api, brief, envelope, events
from castad_runtime import artifacts, db, retention
from castad_runtime.artifacts import volume

from tests.integration.helpers import count, indexes_used, output, requested_envelope, statements_of
from tests.support.installation import Installation

pytestmark = pytest.mark.integration

DAY = dt.timedelta(days=1)
SOURCE = "/castad/test"


@pytest.fixture
def config(installation: Installation) -> api_settings.ApiSettings:
    """The gateway's settings.

    The default retention (30 days of files, timelines and dead letters, 90 of pipelines, 30 of event ids, a 2-hour
    deadline).
    """
    return api_settings.ApiSettings(database_url=installation.database_urls["api"])


@pytest.fixture
def engine(engines: Mapping[str, sa.Engine]) -> sa.Engine:
    return engines["api"]


def project(engine: sa.Engine, payload: events.Payload, event_type: str) -> None:
    projection.apply(engine, envelope.wrap(payload, event_type, SOURCE), payload)


def ended_pipeline(
    engine: sa.Engine, ended_ago: dt.timedelta, lyric: Callable[[str], events.Artifact] | None = None
) -> uuid.UUID:
    """A FAILED pipeline that ended `ended_ago` ago, resuming at the song on a retry.

    Its lyric stage completed (its artifact made by `lyric`) and its song stage failed, `ended_ago` ago by every
    time the gateway keeps of it.
    """
    pipeline_id = running_pipeline(engine)
    job = str(uuid.uuid4())
    done = output()
    completed = events.LyricCompleted(
        pipeline_id=str(pipeline_id),
        stage=events.Stage.LYRIC,
        job_id=job,
        attempt=1,
        artifact=lyric(str(pipeline_id)) if lyric else done.artifact,
        completed_at=dt.datetime.now(dt.UTC),
        brief=brief.Brief(customer_name="바다책방", region="속초"),
        **done.details,
    )
    project(engine, completed, events.stage_event(events.Stage.LYRIC, "completed"))
    failed = events.StageFailed(
        pipeline_id=str(pipeline_id),
        stage=events.Stage.SONG,
        job_id=job,
        attempt=1,
        error_code="provider_rejected",
        error_message="no",
        failed_at=dt.datetime.now(dt.UTC),
    )
    project(engine, failed, events.stage_event(events.Stage.SONG, "failed"))
    with db.transaction(engine) as conn:
        assert repository.get_pipeline(conn, pipeline_id).status == "FAILED"
        backdate(conn, pipeline_id, ended_ago)
    return pipeline_id


def running_pipeline(engine: sa.Engine, created_ago: dt.timedelta = dt.timedelta(0)) -> uuid.UUID:
    body = api.PipelineRequest(customer_name="바다책방", region="속초")
    with db.transaction(engine) as conn:
        accepted = creation.create(conn, body, "tests", str(uuid.uuid4()), 7200)
        backdate(conn, accepted.pipeline_id, created_ago)
    return accepted.pipeline_id


def backdate(conn: sa.Connection, pipeline_id: uuid.UUID, age: dt.timedelta) -> None:
    """Move the times the gateway keeps of a pipeline `age` into the past.

    Those are its request, its end, its stages' ends, its timeline; what has not ended stays so.
    """
    then = repository.now(conn) - age
    p, s, t = tables.pipelines, tables.stages, tables.timeline
    ended = sa.case((p.c.finished_at.is_not(None), then))
    conn.execute(p.update().where(p.c.id == pipeline_id).values(created_at=then, finished_at=ended))
    ended = sa.case((s.c.finished_at.is_not(None), then))
    conn.execute(s.update().where(s.c.pipeline_id == pipeline_id).values(finished_at=ended))
    conn.execute(t.update().where(t.c.pipeline_id == pipeline_id).values(created_at=then))


def left(engine: sa.Engine, table: sa.Table, column: str = "pipeline_id") -> set[Any]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(table.c[column]).distinct()).scalars())


def run(
    engine: sa.Engine, config: api_settings.ApiSettings, store: artifacts.ArtifactStore | None = None
) -> dict[str, int]:
    store = store or artifacts.make_store(config)
    steps = api_retention.steps(engine, config, config.retention_policy(), store, config.upload_limits())
    return retention.Pruner(steps, interval_s=60, batch=config.retention_batch, pause_s=0).run_once()


def test_the_timeline_of_a_pipeline_goes_after_its_ttl_and_its_summary_stays(engine, config):
    old, recent = ended_pipeline(engine, 31 * DAY), ended_pipeline(engine, 29 * DAY)
    running = running_pipeline(engine, created_ago=200 * DAY)  # not ended, however old (its deadline slipped)

    removed = run(engine, config)

    assert removed["timeline entries"] == 3  # the request, lyric.completed, song.failed of `old`
    assert left(engine, tables.timeline) == {recent, running}
    assert left(engine, tables.pipelines, "id") == {old, recent, running}
    assert left(engine, tables.stages) == {old, recent}


def add_notice(engine: sa.Engine, pipeline_id: uuid.UUID, status: str) -> None:
    notice = uuid.uuid4()
    with db.transaction(engine) as conn:
        conn.execute(
            tables.webhook_deliveries.insert().values(
                id=notice,
                pipeline_id=pipeline_id,
                url="https://example.com/",
                event_type="x",
                payload={},
                status=status,
            )
        )
        conn.execute(
            tables.webhook_attempts.insert().values(
                delivery_id=notice, number=1, started_at=repository.now(conn), duration_ms=5, status_code=500
            )
        )


def test_a_pipeline_goes_with_everything_of_it_after_its_ttl_but_not_while_a_notice_is_being_tried(engine, config):
    gone, trying = ended_pipeline(engine, 91 * DAY), ended_pipeline(engine, 91 * DAY)
    recent, running = ended_pipeline(engine, 89 * DAY), running_pipeline(engine, created_ago=200 * DAY)
    add_notice(engine, gone, "delivered")
    add_notice(engine, gone, "failed")
    add_notice(engine, trying, "pending")

    removed = run(engine, config)

    assert removed["pipelines"] == 1
    assert left(engine, tables.pipelines, "id") == {trying, recent, running}
    assert gone not in left(engine, tables.stages) | left(engine, tables.timeline)
    assert left(engine, tables.attempts) == {trying, recent}  # `running` never ran one
    assert left(engine, tables.webhook_deliveries) == {trying}
    assert count(engine, tables.webhook_attempts) == 1
    with db.transaction(engine) as conn:  # its Idempotency-Key is free again: a new request makes a new pipeline
        assert repository.get_pipeline(conn, gone) is None


def add_dead_letter(engine: sa.Engine, queue: str, received_ago: dt.timedelta, status: str = "dead") -> int:
    env = requested_envelope()
    headers = {"x-castad-queue": queue, "x-castad-service": "lyric", "x-castad-reason": "handler failed"}
    fields = dead_letter_rows.describe(str(uuid.uuid4()), headers, env.model_dump_json().encode(), 1 << 20)
    with db.transaction(engine) as conn:
        letter_id = dead_letters.record(conn, fields)
        assert letter_id is not None
        if status != "dead":
            action = {"replayed": "replay", "discarded": "discard"}[status]
            dead_letters.dead_letter_acted(conn, letter_id, action, "tests", "done", status)
        then = repository.now(conn) - received_ago
        letters = tables.dead_letters
        conn.execute(letters.update().where(letters.c.id == letter_id).values(received_at=then, updated_at=then))
    return letter_id


def test_dead_letters_dealt_with_go_after_their_ttl_and_those_still_dead_after_a_longer_one(
    engine, config, installation
):
    queue = installation.topology.queue("lyric")
    replayed, discarded = (
        add_dead_letter(engine, queue, 31 * DAY, "replayed"),
        add_dead_letter(engine, queue, 31 * DAY, "discarded"),
    )
    dead, recent = add_dead_letter(engine, queue, 89 * DAY), add_dead_letter(engine, queue, 29 * DAY, "discarded")
    forgotten = add_dead_letter(engine, queue, 91 * DAY)  # still dead after CASTAD_API_RETENTION_DEAD_LETTERS_LEFT_S

    removed = run(engine, config)

    assert (removed["dead letters"], removed["dead letters nobody dealt with"]) == (2, 1)
    assert left(engine, tables.dead_letters, "id") == {dead, recent}
    assert left(engine, tables.dead_letter_actions, "dead_letter_id") == {recent}
    assert {replayed, discarded, forgotten}.isdisjoint(left(engine, tables.dead_letters, "id"))


def test_creation_counts_go_once_their_minute_is_over(engine, config):
    key = uuid.uuid4()
    with db.transaction(engine) as conn:
        assert keys.count_creation(conn, key, 10) is None
        now = repository.now(conn)
        for minutes in (3, 60, 60 * 24):
            start = now - dt.timedelta(minutes=minutes)
            conn.execute(tables.key_windows.insert().values(key_id=key, window_start=start, count=1))

    assert run(engine, config)["creation counts"] == 3
    assert count(engine, tables.key_windows) == 1  # this minute's


class InProcess:
    """The gateway's HTTP API in this process, on the installation's database.

    Its background parts are not started; each request goes through the whole ASGI application.
    """

    def __init__(self, application: Any, headers: dict[str, str]) -> None:
        self.application = application
        self.headers = headers

    def request(self, method: str, path: str, **options: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.application)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://gateway", headers=self.headers
            ) as client:
                return await client.request(method, path, **options)

        return asyncio.run(send())

    def get(self, path: str) -> httpx.Response:
        return self.request("GET", path)

    def post(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        return self.request("POST", path, json=body or {})


@pytest.fixture
def http(installation: Installation, engine: sa.Engine, config: api_settings.ApiSettings) -> InProcess:
    gateway = deps.Gateway(
        config=config,
        engine=engine,
        notifications=notifications.PipelineNotifications(config.database_url),
        store=volume.VolumeStore(installation.artifacts_dir),
    )
    return InProcess(app.create_app(gateway), {**installation.auth, "X-Castad-Actor": "tests"})


def test_a_retry_is_refused_with_a_409_once_retention_may_delete_what_it_needs(engine, http):
    # 30 days of files, a 2-hour deadline, an hour to spare: a retry must start within 29 days and 21 hours.
    too_old, recent = ended_pipeline(engine, 30 * DAY - dt.timedelta(hours=2)), ended_pipeline(engine, 29 * DAY)

    refused = http.post(f"/v1/pipelines/{too_old}/retry")
    accepted = http.post(f"/v1/pipelines/{recent}/retry")

    assert refused.status_code == 409
    assert refused.json()["status"] == "FAILED"
    assert refused.json()["detail"].startswith(f"pipeline {too_old} can no longer be retried: its lyric stage ended")
    assert "CASTAD_RETENTION_ARTIFACTS_S" in refused.json()["detail"]
    assert (accepted.status_code, accepted.json()["resumes_at"]) == (202, "song")
    with db.transaction(engine) as conn:
        assert repository.get_pipeline(conn, too_old).retries == 0  # nothing was asked of the stages


def test_a_replay_is_refused_with_a_409_once_its_event_is_older_than_consumers_remember(engine, http, installation):
    queue = installation.topology.queue("lyric")
    too_old, recent = add_dead_letter(engine, queue, 30 * DAY), add_dead_letter(engine, queue, 29 * DAY)

    refused = http.post(f"/v1/dead-letters/{too_old}/replay")
    accepted = http.post(f"/v1/dead-letters/{recent}/replay")
    bulk = http.post("/v1/dead-letters/replay", {"limit": 10})

    assert (refused.status_code, refused.json()["status"]) == (409, "dead")
    assert "can no longer be replayed" in refused.json()["detail"]
    assert "CASTAD_RETENTION_INBOX_S" in refused.json()["detail"]
    assert accepted.status_code == 202 and "sent back to" in accepted.json()["detail"]
    assert bulk.json()["replayed"] == [] and "CASTAD_RETENTION_INBOX_S" in bulk.json()["refused"][str(too_old)]
    with db.transaction(engine) as conn:
        assert dead_letters.get_dead_letter(conn, too_old).status == "dead"


def test_a_download_of_a_file_retention_deleted_is_a_410(engine, http, installation):
    store = volume.VolumeStore(installation.artifacts_dir)

    def lyrics(pipeline_id: str) -> events.Artifact:
        with store.scratch(pipeline_id, events.Stage.LYRIC, 1, ".txt") as scratch:
            scratch.write_text("lyrics")
            return store.keep(scratch, pipeline_id, events.Stage.LYRIC, "text/plain")

    old, recent = ended_pipeline(engine, 31 * DAY, lyrics), ended_pipeline(engine, 29 * DAY, lyrics)

    gone = http.get(f"/v1/pipelines/{old}/artifacts/lyric")
    kept = http.get(f"/v1/pipelines/{recent}/artifacts/lyric")

    assert gone.status_code == 410 and "CASTAD_RETENTION_ARTIFACTS_S" in gone.json()["detail"]
    assert (kept.status_code, kept.text) == (200, "lyrics")
    assert http.get(f"/v1/pipelines/{old}").json()["status"] == "FAILED"  # the pipeline itself is still kept


def test_a_completed_event_naming_another_pipelines_or_stages_file_gets_a_404_not_the_file(engine, http, installation):
    store = volume.VolumeStore(installation.artifacts_dir)
    made: dict[str, events.Artifact] = {}

    def file_of(stage: events.Stage, text: str):  # noqa: ANN202
        def keep(pipeline_id: str) -> events.Artifact:
            with store.scratch(pipeline_id, stage, 1, ".txt") as scratch:
                scratch.write_text(text)
                made[text] = store.keep(scratch, pipeline_id, stage, "text/plain")
            return made[text]

        return keep

    victim = ended_pipeline(engine, dt.timedelta(0), file_of(events.Stage.LYRIC, "the victim's lyrics"))
    ended_pipeline(
        engine, dt.timedelta(0), file_of(events.Stage.SONG, "a song")
    )  # a song file, of a pipeline of its own
    other_pipeline = ended_pipeline(engine, dt.timedelta(0), lambda _: made["the victim's lyrics"])
    other_stage = ended_pipeline(engine, dt.timedelta(0), lambda _: made["a song"])

    own = http.get(f"/v1/pipelines/{victim}/artifacts/lyric")
    stolen = http.get(f"/v1/pipelines/{other_pipeline}/artifacts/lyric")
    wrong_stage = http.get(f"/v1/pipelines/{other_stage}/artifacts/lyric")

    assert (own.status_code, own.text) == (200, "the victim's lyrics")
    assert stolen.status_code == 404 and "the victim's lyrics" not in stolen.text
    assert wrong_stage.status_code == 404 and "a song" not in wrong_stage.text


def test_a_file_changed_on_the_volume_or_swapped_for_a_link_is_not_served_and_the_operators_are_told(
    engine, http, installation, tmp_path
):
    """Every stage mounts the volume: the gateway serves a file only with the bytes and size its event recorded."""
    store = volume.VolumeStore(installation.artifacts_dir)
    kept: list[events.Artifact] = []

    def lyrics(pipeline_id: str) -> events.Artifact:
        with store.scratch(pipeline_id, events.Stage.LYRIC, 1, ".txt") as scratch:
            scratch.write_text("the finished lyrics")
            kept.append(store.keep(scratch, pipeline_id, events.Stage.LYRIC, "text/plain"))
        return kept[-1]

    pipeline_id = ended_pipeline(engine, dt.timedelta(0), lyrics)
    path = store.path(kept[0])
    url = f"/v1/pipelines/{pipeline_id}/artifacts/lyric"
    assert (http.get(url).status_code, http.get(url).text) == (200, "the finished lyrics")

    path.write_text("the forged  lyrics")  # the same size, one word changed: as a stage with the volume could
    changed = http.get(url)
    elsewhere = tmp_path / "same-bytes.txt"
    elsewhere.write_text("the finished lyrics")
    path.unlink()
    path.symlink_to(elsewhere)  # a link to a file with the very bytes on record: still not the file itself
    linked = http.get(url)
    path.unlink()
    path.write_text("the finished lyrics")
    restored = http.get(url)

    assert changed.status_code == 500 and "lyrics" not in changed.text
    assert "not the one on record" in changed.json()["detail"]
    assert linked.status_code == 404 and "lyrics" not in linked.text  # a link out of the pipeline's place
    assert (restored.status_code, restored.text) == (200, "the finished lyrics")
    failures = [line for line in http.get("/metrics").text.splitlines() if line.startswith("castad_api_integrity")]
    assert "castad_api_integrity_failures_total 1.0" in failures


def test_every_retention_query_of_the_gateway_finds_its_rows_through_an_index(engine, config):
    """The plans of the statements the gateway's retention runs use the indexes made for them.

    On a database shaped as retention leaves it: many pipelines that ended long ago without their timelines, recent
    ones with theirs.
    """
    with db.transaction(engine) as conn:
        for prefix, n, ended, events_each in (("old", 5000, "31 days", 0), ("new", 1000, "0 days", 10)):
            conn.execute(
                sa.text(
                    "INSERT INTO pipelines (id, idempotency_key, request_hash, brief, status, created_at, finished_at)"
                    " SELECT gen_random_uuid(), :prefix || g, 'h', '{}', 'SUCCEEDED', t, t"
                    " FROM generate_series(1, :n) g,"
                    " LATERAL (SELECT now() - CAST(:ended AS interval) - g * interval '4 minutes' AS t) ended"
                ),
                {"prefix": prefix, "n": n, "ended": ended},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO pipeline_events (pipeline_id, event_id, event_type, data, created_at)"
                    " SELECT id, gen_random_uuid(), 'e', '{}', created_at FROM pipelines, generate_series(1, :k)"
                    " WHERE idempotency_key LIKE :prefix || '%'"
                ),
                {"prefix": prefix, "k": events_each},
            )
    with engine.connect() as conn:
        conn.execute(sa.text("ANALYZE"))
        conn.commit()
    with statements_of(engine) as statements:
        run(engine, config)

    expected = {"outbox_published", "inbox_received", "pipeline_events_created", "pipelines_ended"}
    assert expected | {"dead_letters_settled"} <= indexes_used(engine, statements)
