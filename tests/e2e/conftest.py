"""A running Castad per test: api, relay, lyric, song and video as separate processes.

Settings are the documented ones, tuned for speed: tiny videos, short backoff and
leases, so a pipeline takes a second or two and a lost lease is found in a few.

Besides the gateway, tests look at what each service recorded in its own database
(`dbs`) and at the broker (`broker`), never at a service's memory.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
import httpx_sse
import pika
import pytest
import sqlalchemy as sa
from castad_api import tables as api_tables
from castad_cli import client as client_
from castad_contracts import api, brief
from castad_local import stack as stack_
from castad_runtime import tables
from playwright.sync_api import Browser
from sqlalchemy.pool import NullPool

from tests.e2e import browser as browser_
from tests.support import briefs, waits
from tests.support.installation import Installation

STAGES = ("LYRIC", "SONG", "VIDEO")
STAGE_SERVICES = ("lyric", "song", "video")
FAST = {
    "CASTAD_LOG_LEVEL": "INFO",
    "CASTAD_VIDEO_SHORT_SIDE": "144",
    "CASTAD_VIDEO_FPS": "4",
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
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELED")


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
    def __init__(self, installation: Installation, env: Mapping[str, str], log_dir: pathlib.Path) -> None:
        self.installation = installation
        self.port = int(env.get("CASTAD_API_PORT") or stack_.free_port())  # given: a provider calls it back
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.services = stack_.Stack({**installation.env(), **FAST, **env, "CASTAD_API_PORT": str(self.port)}, log_dir)
        self.client = client_.Client(self.base_url, api_key=installation.api_key)
        self.http = httpx.Client(base_url=self.base_url, timeout=10, headers=installation.auth)

    def start(self) -> None:
        self.services.start_all()
        self.services.wait_ready(self.base_url)

    def close(self) -> None:
        self.client.close()
        self.http.close()
        self.services.stop_all()  # together, then waits for each

    def submit(self, body: brief.Brief | None = None, key: str | None = None) -> str:
        return self.client.submit(body or briefs.sample(), key).id

    def wait_terminal(self, pipeline_ids: list[str], timeout_s: float = 120.0) -> dict[str, api.PipelineView]:
        """Poll until every pipeline is SUCCEEDED, FAILED or CANCELED; fail the test on timeout."""
        deadline = time.monotonic() + timeout_s
        views: dict[str, api.PipelineView] = {}
        pending = list(pipeline_ids)
        while pending:
            self.services.check_alive()
            for pipeline_id in list(pending):
                view = self.client.status(pipeline_id)
                if view.status in TERMINAL:
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
    """Start a Castad with extra settings: `castad({"CASTAD_SONG_FAULT_FAILURE_RATE": "0.3"})`."""
    started: list[RunningCastad] = []

    def start(env: Mapping[str, str] | None = None) -> RunningCastad:
        running = RunningCastad(installation, env or {}, tmp_path / "logs")
        started.append(running)
        running.start()
        return running

    yield start
    for running in started:
        running.close()


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

    def unpublished(self) -> dict[str, int]:
        """Outbox rows not yet confirmed by the broker, per database (only the non-zero ones)."""
        counts = {
            service: self.scalar(
                service, sa.select(sa.func.count()).select_from(self.outbox).where(self.outbox.c.published_at.is_(None))
            )
            for service in self.engines
        }
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
