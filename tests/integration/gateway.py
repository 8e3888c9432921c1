"""The gateway's projection driven event by event, and its HTTP API served from this process.

The events are applied as its consumer applies them: for tests of what the gateway makes of a known sequence of
events.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import pathlib
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import sqlalchemy as sa
import uvicorn
from castad_api import app, creation, deps, keys, notifications, operations, projection, repository, tables
from castad_api import settings as api_settings
from castad_contracts import api, brief, envelope, events
from castad_local import stack
from castad_runtime import db, groups
from castad_runtime.artifacts import volume
from castad_testkit import briefs

from tests.integration.helpers import now
from tests.support import waits

LYRICS = events.Lyrics(
    title="바다", language=brief.Language.KOREAN, sections=(events.LyricSection(kind="verse", lines=("라",)),)
)
MEDIA = {events.Stage.LYRIC: "text/plain", events.Stage.SONG: "audio/wav", events.Stage.VIDEO: "video/mp4"}


def ago(**delta: float) -> dt.datetime:
    return now() - dt.timedelta(**delta)


class Projection:
    """Pipelines accepted by the gateway, and the stages' events about them applied to its projection."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.applied: list[envelope.Envelope] = []
        self._group: list[envelope.Envelope] | None = None

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Project the events delivered inside together, in one transaction, at the block's end.

        As the gateway's consumer projects those that come at the same time (projection.apply_all).
        """
        self._group = []
        try:
            yield
            results = projection.apply_all(self.engine, [(env, env.payload()) for env in self._group])
            for env, result in zip(self._group, results, strict=True):
                if result is groups.ALONE:  # as the Projector's consumer thread of that event does
                    projection.apply(self.engine, env, env.payload())
        finally:
            self._group = None

    def create(
        self, customer: str = "Cafe Blue", tenant: str = "tests", region: str = "Busan", callback_url: str | None = None
    ) -> str:
        body = api.PipelineRequest(customer_name=customer, region=region, callback_url=callback_url)
        with db.transaction(self.engine) as conn:
            return str(creation.create(conn, body, tenant, str(uuid.uuid4()), 7200).pipeline_id)

    def event(
        self,
        pipeline_id: str,
        stage: events.Stage,
        fact: events.StageFact,
        attempt: int,
        at: dt.datetime,
        **options: Any,
    ) -> envelope.Envelope:
        """Apply `<stage>.<fact>` of `attempt` that happened `at` (options: see `envelope`).

        Returns its envelope, to deliver it again with `deliver`.
        """
        return self.deliver(self.envelope(pipeline_id, stage, fact, attempt, at, **options))

    def envelope(
        self,
        pipeline_id: str,
        stage: events.Stage,
        fact: events.StageFact,
        attempt: int,
        at: dt.datetime,
        *,
        worker: str = "w",
        code: str = "provider_error",
        operation: int = 1,
        time: dt.datetime | None = None,
    ) -> envelope.Envelope:
        """The envelope of `<stage>.<fact>` of `attempt` that happened `at`, not delivered.

        `at` is the payload's time; the envelope's is `time`, by default `at` too.
        """
        common = {"pipeline_id": pipeline_id, "stage": stage, "job_id": f"job-{stage.value}", "attempt": attempt}
        payload: events.Payload
        if fact == "started":
            payload = events.StageStarted(**common, started_at=at, worker=worker)
        elif fact == "retrying":
            payload = events.StageRetrying(
                **common,
                max_attempts=5,
                error_code=code,
                error_message=f"{code} on attempt {attempt}",
                next_attempt_at=at + dt.timedelta(seconds=1),
            )
        elif fact == "failed":
            payload = events.StageFailed(**common, error_code=code, error_message=f"{code} for good", failed_at=at)
        elif fact == "canceled":
            payload = events.StageCanceled(**common, operation=operation, reason="not wanted", canceled_at=at)
        else:
            payload = self._completed(common, at)
        env = envelope.wrap(payload, events.stage_event(stage, fact), f"/castad/{stage.value}")
        return env.model_copy(update={"time": time or at})

    def deliver(self, env: envelope.Envelope) -> envelope.Envelope:
        if self._group is not None:
            self._group.append(env)
        else:
            projection.apply(self.engine, env, env.payload())
        self.applied.append(env)
        return env

    def _completed(self, common: dict[str, Any], at: dt.datetime) -> events.Payload:
        stage: events.Stage = common["stage"]
        artifact = events.Artifact(
            uri=f"file:///artifacts/{stage.value}", sha256="0" * 64, size=1, media_type=MEDIA[stage]
        )
        fields: dict[str, Any] = {
            **common,
            "artifact": artifact,
            "completed_at": at,
            "brief": briefs.sample("Cafe Blue", region="Busan"),
        }
        if stage is events.Stage.LYRIC:
            return events.LyricCompleted(**fields, lyrics=LYRICS)
        if stage is events.Stage.SONG:
            return events.SongCompleted(**fields, lyrics=LYRICS, timed_lines=(), song_duration_s=3.0)
        return events.VideoCompleted(**fields, width=144, height=256)

    def run(self, pipeline_id: str, stage: events.Stage, start: dt.datetime, seconds: float, attempt: int = 1) -> None:
        """An attempt that starts at `start` and completes `seconds` later."""
        self.event(pipeline_id, stage, "started", attempt, start, worker=f"{stage.value}@host:{attempt}")
        self.event(pipeline_id, stage, "completed", attempt, start + dt.timedelta(seconds=seconds))

    def cancel(self, pipeline_id: str, actor: str = "ops", reason: str = "the customer withdrew") -> int:
        with db.transaction(self.engine) as conn:
            done = operations.cancel(conn, uuid.UUID(pipeline_id), reason, actor)
        assert done.operation is not None
        return done.operation

    def backdate(self, pipeline_id: str, event_type: str, at: dt.datetime) -> None:
        """As if the gateway's own entry `event_type` (a request, an operator's action) was written `at`."""
        timeline = tables.timeline
        with db.transaction(self.engine) as conn:
            conn.execute(
                timeline.update()
                .where(timeline.c.pipeline_id == uuid.UUID(pipeline_id), timeline.c.event_type == event_type)
                .values(occurred_at=at)
            )

    def ended_long_ago(self, pipeline_id: str, stage: events.Stage) -> None:
        """As if the stage ended ten years ago: retention has deleted its files."""
        stages = repository.stages
        with db.transaction(self.engine) as conn:
            conn.execute(
                stages.update()
                .where(stages.c.pipeline_id == uuid.UUID(pipeline_id), stages.c.stage == stage.value)
                .values(finished_at=sa.func.now() - dt.timedelta(days=3650))
            )


class RunningApi:
    """The gateway's HTTP API (no consumer) on the installation's database, served by uvicorn on a thread."""

    def __init__(self, database_url: str, artifacts_dir: pathlib.Path, **settings: Any) -> None:
        config = api_settings.ApiSettings(database_url=database_url, **settings)
        self.engine = db.make_engine(database_url)
        self.gateway = gateway = deps.Gateway(
            config=config,
            engine=self.engine,
            notifications=notifications.PipelineNotifications(database_url),
            store=volume.VolumeStore(artifacts_dir),
        )

        @contextlib.asynccontextmanager
        async def lifespan(_: Any) -> AsyncIterator[None]:
            probes = app.probe_server(gateway, {})  # with CASTAD_API_HEALTH_PORT, as the gateway's own does
            if probes is not None:
                probes.start()
            gateway.notifications.start()
            try:
                yield
            finally:
                await gateway.notifications.stop()
                if probes is not None:
                    probes.stop()
                gateway.broker_check.close()

        port = stack.free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app.create_app(gateway, lifespan), host="127.0.0.1", port=port, log_config=None)
        )
        self.thread = threading.Thread(target=self.server.run, name="test-api", daemon=True)
        self.thread.start()
        self.clients: list[httpx.Client] = []
        waits.until(lambda: self.server.started, what="the gateway's HTTP server started")

    def client(self, key: str | None) -> httpx.Client:
        """A client calling with `key` (None: with none)."""
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        self.clients.append(httpx.Client(base_url=self.base_url, headers=headers, timeout=10))
        return self.clients[-1]

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.server.should_exit = True
        self.thread.join(15)
        self.engine.dispose()


def make_key(engine: sa.Engine, tenant: str, *scopes: keys.Scope) -> str:
    with db.transaction(engine) as conn:
        return keys.create(conn, tenant, frozenset(scopes), f"{tenant} test key").key
