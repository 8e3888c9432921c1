"""A running Castad: api, relay, lyric, song and video as separate processes.

One is shared by every test of the session that needs no settings of its own (`shared`): each such test has a
tenant of its own and sets the faults it needs while the services run. A test that needs other settings, or stops,
kills or cuts off what others would share, starts its own (`castad`).

Settings are the documented ones, tuned for speed: tiny videos, songs without a voice, short backoff and
leases, so a pipeline takes a second or two and a lost lease is found in a few. (A voice costs a second of CPU a
song and two more to load; test_languages sings every language through the whole pipeline, and the unit tests
check what the voice sings.)

Besides the gateway, tests look at what each service recorded in its own database
(`dbs`) and at the broker (`broker`), never at a service's memory.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import httpx
import httpx_sse
import pika
import pytest
import sqlalchemy as sa
from castad_api import keys, model
from castad_api import tables as api_tables
from castad_cli import client as client_
from castad_contracts import api, brief, topology
from castad_local import access
from castad_local import stack as stack_
from castad_runtime import db, tables
from castad_runtime.stage import faults
from castad_testkit import briefs
from playwright.sync_api import Browser
from sqlalchemy.pool import NullPool

from tests.e2e import browser as browser_
from tests.support import installation as installation_
from tests.support import waits
from tests.support.installation import Installation

STAGES = tuple(stage.upper() for stage in topology.STAGES)  # as CASTAD_<STAGE>_* names them
FAST = {
    "CASTAD_LOG_LEVEL": "INFO",
    "CASTAD_VIDEO_SHORT_SIDE": "144",
    "CASTAD_VIDEO_FPS": "4",
    "CASTAD_SONG_VOICE": "off",
    "CASTAD_RELAY_FALLBACK_POLL_S": "1",
    "CASTAD_RELAY_RETRY_DELAY_S": "0.2",
    "CASTAD_API_SSE_POLL_S": "0.5",
    "CASTAD_API_SSE_PING_S": "1",
    **{
        f"CASTAD_{stage}_{name}": value
        for stage in STAGES
        for name, value in (
            ("BACKOFF_BASE_S", "0.05"),
            ("BACKOFF_MAX_S", "0.3"),
            ("LEASE_S", "3"),
            ("POLL_S", "0.2"),
            ("MAX_ATTEMPTS", "12"),
            ("CONCURRENCY", "4"),
        )
    },
}


def in_order(seen: list[Any], full: list[Any]) -> bool:
    """Whether `seen` is `full` with some items left out, the rest in the same order.

    The gateway's projection drops an event that arrives after a later one of the same stage
    (its consumer threads may take them out of order), so an event stream shows a stage's
    facts in order but not always all of them; the stage's own outbox has every one. Facts of
    different stages may come in any order (the next stage may tell of its start before the
    previous one's end is applied): compare one stage's at a time.
    """
    remaining = iter(full)
    return all(any(item == candidate for candidate in remaining) for item in seen)


def outbox_facts(rows: list[Any]) -> list[tuple[str, str, int | None]]:
    """(stage, fact, attempt) of a stage's outbox rows, as the gateway's events name them."""
    facts = []
    for row in rows:
        stage, fact = row["routing_key"].split(".", 1)
        facts.append((stage, fact, row["envelope"]["data"].get("attempt")))
    return facts


class RunningCastad:
    """A Castad's services, each its own process, and clients of its gateway calling with one key."""

    def __init__(self, installation: Installation, services: stack_.Stack, base_url: str, api_key: str) -> None:
        self.installation = installation
        self.services = services
        self.base_url = base_url
        self.client = client_.Client(base_url, api_key=api_key)
        self.http = httpx.Client(base_url=base_url, timeout=10, headers={"Authorization": f"Bearer {api_key}"})

    @classmethod
    def start(
        cls,
        installation: Installation,
        env: Mapping[str, str],
        log_dir: pathlib.Path,
        only: Sequence[str] = topology.SERVICES,
    ) -> RunningCastad:
        """Start the services (`only` these) with FAST and `env`; the clients call with the installation's admin key."""
        port = int(env.get("CASTAD_API_PORT") or stack_.free_port())  # given: a provider calls it back
        services = stack_.Stack({**installation.env(), **FAST, **env, "CASTAD_API_PORT": str(port)}, log_dir)
        running = cls(installation, services, f"http://127.0.0.1:{port}", installation.api_key)
        for name in only:
            services.start(name)
        try:
            services.wait_ready(running.base_url)
        except BaseException:
            running.discard()
            raise
        return running

    def close(self) -> None:
        """Close the clients and stop every service, each as SIGTERM stops it (a test that reads what they flush)."""
        self.client.close()
        self.http.close()
        self.services.stop_all()  # together, then waits for each

    def discard(self) -> None:
        """Close the clients and kill every service: after a test, whose stop nobody looks at (test_stops does)."""
        self.client.close()
        self.http.close()
        self.services.kill_all()

    def submit(self, body: brief.Brief | None = None, key: str | None = None) -> str:
        return self.client.submit(body or briefs.sample(), key).id

    def metrics_urls(self) -> dict[str, str]:
        """Service -> its /metrics: the gateway's on its API port, a worker's on its CASTAD_<SERVICE>_HEALTH_PORT."""
        urls = {topology.GATEWAY: f"{self.base_url}/metrics"}
        for worker in topology.WORKERS:
            if port := self.services.env.get(f"CASTAD_{worker.upper()}_HEALTH_PORT"):
                urls[worker] = f"http://127.0.0.1:{port}/metrics"
        return urls

    def faults(self, stage: str, **fields: Any) -> None:
        """Inject these faults into `stage` from now on (`faults("song")`: none): its fault switch must be on."""
        engine = db.make_engine(self.installation.database_urls[stage])
        try:
            with db.transaction(engine) as conn:
                faults.inject(conn, faults.Faults(**fields))
        finally:
            engine.dispose()

    def wait_terminal(self, pipeline_ids: list[str], timeout_s: float = 120.0) -> dict[str, api.PipelineView]:
        """Poll until every pipeline is SUCCEEDED, FAILED or CANCELED; fail the test on timeout."""
        deadline = time.monotonic() + timeout_s
        views: dict[str, api.PipelineView] = {}
        pending = list(pipeline_ids)
        while pending:
            self.services.check_alive()
            for pipeline_id in list(pending):
                view = self.client.status(pipeline_id)
                if view.status in api.ENDED:
                    views[pipeline_id] = view
                    pending.remove(pipeline_id)
            if pending and time.monotonic() > deadline:
                states = {p: self.client.status(p).status for p in pending}
                pytest.fail(f"not finished after {timeout_s} s: {states}; logs in {self.services.log_dir}")
            if pending:
                time.sleep(0.2)
        return views

    def wait_until(self, what: str, condition: Callable[[], Any], timeout_s: float = 30.0) -> Any:
        """Poll `condition` until it returns something truthy (and return it); fail on timeout or a dead service."""
        return waits.until(
            condition,
            what=f"{what} (logs in {self.services.log_dir})",
            timeout_s=timeout_s,
            interval_s=0.1,
            check=self.services.check_alive,
        )

    def events(self, pipeline_id: str, last_event_id: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        """(id, event name, data) of every event the gateway streams until it closes the stream.

        Only for a pipeline that is (about to be) terminal: the stream ends there. Keep-alive
        comments arrive every CASTAD_API_SSE_PING_S, so a read timeout means a stuck stream.
        """
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        received = []
        with httpx_sse.connect_sse(
            self.http,
            "GET",
            f"/v1/pipelines/{pipeline_id}/events",
            headers=headers,
            timeout=httpx.Timeout(10.0, read=15.0),
        ) as source:
            assert source.response.status_code == 200, source.response.read()
            assert source.response.headers["content-type"].startswith("text/event-stream")
            for sse in source.iter_sse():
                if sse.data:
                    received.append((sse.id, sse.event, json.loads(sse.data)))
        return received


@pytest.fixture
def castad(installation: Installation, tmp_path: pathlib.Path) -> Iterator[Callable[..., RunningCastad]]:
    """Start a Castad of the test's own with extra settings: `castad({"CASTAD_API_MAX_BODY_BYTES": "2048"})`.

    For a test that needs settings of its own, or breaks what others would share; any other takes `shared`.
    `only=("api",)`: the gateway alone, for a test of nothing else.
    """
    started: list[RunningCastad] = []

    def start(env: Mapping[str, str] | None = None, only: Sequence[str] = topology.SERVICES) -> RunningCastad:
        started.append(RunningCastad.start(installation, env or {}, tmp_path / "logs", only))
        return started[-1]

    yield start
    for running in started:
        running.discard()


# The session's shared Castad: the fast settings, every stage's fault switch on (a test sets the faults it needs
# while the services run), a handler that keeps failing dead-lettered after one retry, and photos on this machine's
# plain-http hosts allowed; and every worker's probes and metrics on a port of its own (`metrics_urls`).
SHARED = {
    **{f"CASTAD_{stage}_FAULT_SWITCH": "true" for stage in STAGES},
    "CASTAD_HANDLER_RETRIES": "1",
    "CASTAD_API_PHOTO_ALLOW_PRIVATE": "true",
    "CASTAD_VIDEO_ALLOW_PRIVATE": "true",
}
USER_SCOPES = frozenset({keys.Scope.SUBMIT, keys.Scope.READ, keys.Scope.OPERATE})


class SharedCastad(RunningCastad):
    """The session's shared Castad as one test sees it: a tenant of its own, the faults it sets.

    Its clients call with a key of that tenant (submit, read, operate), so that listings and counts show the test's
    own pipelines; `admin` is the same Castad calling with the installation's admin key (dead letters, every
    tenant). `dbs` and `broker` look at the shared installation: filter by the test's pipelines. After the test,
    `finish` takes its faults away, starts again a service it stopped, and cancels every pipeline that has not ended
    (of any tenant it made).
    """

    def __init__(self, shared: RunningCastad, dbs: Databases, broker: Broker) -> None:
        self.tenant = f"t{uuid.uuid4().hex[:10]}"
        self.api_key = access.create_key(self.tenant, USER_SCOPES, f"{self.tenant}: a test", shared.installation.env())
        super().__init__(shared.installation, shared.services, shared.base_url, self.api_key)
        self.admin = RunningCastad(shared.installation, shared.services, shared.base_url, shared.installation.api_key)
        self.dbs = dbs
        self.broker = broker

    def finish(self) -> None:
        for stage in topology.STAGES:
            self.faults(stage)
        missing = [name for name in self.services.commands if name not in self.services.processes]
        for name in missing:
            self.services.start(name)
        if missing:
            self.services.wait_ready(self.base_url)
        going_on = [  # of any tenant (the admin key sees all): a test may make tenants of its own
            item["id"]
            for status in model.PipelineStatus
            if not status.terminal
            for item in self.admin.http.get("/v1/pipelines", params={"status": status, "limit": 100}).json()["items"]
        ]
        for pipeline_id in going_on:
            self.admin.http.post(f"/v1/pipelines/{pipeline_id}/cancel", json={"reason": "the test ended"})
        self.admin.wait_terminal(going_on, timeout_s=60)
        # The next test counts what moves from its start (metrics, published rows, queued messages): nothing of
        # this one's may still be on its way.
        self.wait_until("every outbox row published or parked, and every queue empty", self._quiet)
        for each in (self.admin.client, self.admin.http, self.client, self.http):
            each.close()

    def _quiet(self) -> bool:
        queues = [self.installation.topology.queue(service) for service in self.installation.topology.services]
        return not self.dbs.on_their_way() and not any(self.broker.ready(queue) for queue in queues)


@contextlib.contextmanager
def castad_of(
    templates: dict[str, str], base: pathlib.Path, env: Mapping[str, str], only: Sequence[str] = topology.SERVICES
) -> Iterator[RunningCastad]:
    """A Castad with settings `env` on an installation of its own, for many tests (a session's, a module's)."""
    with installation_.made(templates, base, prefix="s") as installation:
        running = RunningCastad.start(installation, env, base / "logs", only)
        try:
            yield running
        finally:
            running.discard()


def view_of(running: RunningCastad) -> Iterator[SharedCastad]:
    """The body of a fixture that gives a test its view of a Castad many tests share (see SharedCastad)."""
    dbs = Databases(running.installation.database_urls)
    broker = Broker(running.installation)
    view = SharedCastad(running, dbs, broker)
    try:
        yield view
    finally:
        try:
            view.finish()
        finally:
            dbs.close()
            broker.close()


@pytest.fixture(scope="session")
def shared_castad(
    migrated_templates: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningCastad]:
    probes = {f"CASTAD_{worker.upper()}_HEALTH_PORT": str(stack_.free_port()) for worker in topology.WORKERS}
    with castad_of(migrated_templates, tmp_path_factory.mktemp("shared"), {**SHARED, **probes}) as running:
        yield running


@pytest.fixture
def shared(shared_castad: RunningCastad) -> Iterator[SharedCastad]:
    """The session's shared Castad, for a test that needs no settings of its own (faults it sets while it runs)."""
    yield from view_of(shared_castad)


class Databases:
    """Read-only look into each service's own database (api, lyric, song, video)."""

    jobs = tables.jobs
    attempts = tables.attempts
    outbox = tables.outbox
    inbox = tables.inbox
    pipelines = api_tables.pipelines
    timeline = api_tables.timeline
    dead_letters = api_tables.dead_letters

    def __init__(self, urls: Mapping[str, str]) -> None:
        self.engines = {service: sa.create_engine(url, poolclass=NullPool) for service, url in urls.items()}

    def close(self) -> None:
        for engine in self.engines.values():
            engine.dispose()

    def rows(self, service: str, statement: sa.Executable) -> list[sa.RowMapping]:
        with self.engines[service].connect() as conn:
            return list(conn.execute(statement).mappings())

    def scalar(self, service: str, statement: sa.Executable) -> Any:
        with self.engines[service].connect() as conn:
            return conn.execute(statement).scalar()

    def jobs_of(self, service: str, pipeline_ids: list[str] | None = None) -> list[sa.RowMapping]:
        query = sa.select(self.jobs).order_by(self.jobs.c.created_at)
        if pipeline_ids is not None:
            query = query.where(self.jobs.c.pipeline_id.in_(pipeline_ids))
        return self.rows(service, query)

    def attempts_of(self, service: str, job_id: Any) -> list[sa.RowMapping]:
        query = sa.select(self.attempts).where(self.attempts.c.job_id == job_id).order_by(self.attempts.c.number)
        return self.rows(service, query)

    def outbox_of(self, service: str, pipeline_id: str | None = None) -> list[sa.RowMapping]:
        query = sa.select(self.outbox).order_by(self.outbox.c.id)
        if pipeline_id is not None:
            query = query.where(self.outbox.c.pipeline_id == pipeline_id)
        return self.rows(service, query)

    def inbox_of(self, service: str, pipeline_id: str) -> list[sa.RowMapping]:
        query = sa.select(self.inbox).where(self.inbox.c.pipeline_id == pipeline_id)
        return self.rows(service, query)

    def unpublished(self, pipeline_ids: list[str] | None = None) -> dict[str, int]:
        """Outbox rows (of these pipelines) not yet confirmed by the broker, per database (only the non-zero ones)."""
        query = sa.select(sa.func.count()).select_from(self.outbox).where(self.outbox.c.published_at.is_(None))
        if pipeline_ids is not None:
            query = query.where(self.outbox.c.pipeline_id.in_(pipeline_ids))
        counts = {service: self.scalar(service, query) for service in self.engines}
        return {service: count for service, count in counts.items() if count}

    def on_their_way(self) -> dict[str, int]:
        """Outbox rows the relay has yet to publish (neither published nor parked), per database (the non-zero ones)."""
        query = sa.select(sa.func.count()).select_from(self.outbox)
        query = query.where(self.outbox.c.published_at.is_(None), self.outbox.c.parked_at.is_(None))
        counts = {service: self.scalar(service, query) for service in self.engines}
        return {service: count for service, count in counts.items() if count}

    def timeline_of(self, pipeline_id: str) -> list[sa.RowMapping]:
        query = sa.select(self.timeline).where(self.timeline.c.pipeline_id == pipeline_id).order_by(self.timeline.c.seq)
        return self.rows("api", query)


@pytest.fixture
def dbs(installation: Installation) -> Iterator[Databases]:
    databases = Databases(installation.database_urls)
    yield databases
    databases.close()


class Broker:
    """The installation's exchange and queues, seen through a plain AMQP connection."""

    def __init__(self, installation: Installation) -> None:
        self.topology = installation.topology
        self.connection = pika.BlockingConnection(pika.URLParameters(installation.amqp_url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()

    def ready(self, queue: str) -> int:
        """Messages waiting in a queue (not counting those delivered and not yet acknowledged)."""
        return int(self.channel.queue_declare(queue, passive=True).method.message_count)

    def consumers(self, queue: str) -> int:
        return int(self.channel.queue_declare(queue, passive=True).method.consumer_count)

    def publish(self, routing_key: str, body: bytes, properties: pika.BasicProperties) -> None:
        """Publish to the installation's exchange; raises unless the broker confirmed and routed it."""
        self.channel.basic_publish(self.topology.exchange, routing_key, body, properties, mandatory=True)


@pytest.fixture
def broker(installation: Installation) -> Iterator[Broker]:
    connection = Broker(installation)
    yield connection
    connection.close()


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Debian's chromium driven by playwright (tests/e2e/browser.py)."""
    with browser_.launched() as launched:
        yield launched
