"""Small tools the integration tests share: polling, events, the outbox, queues, an event loop thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import json
import random
import re
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

import pika
import psycopg.sql
import pytest
import sqlalchemy as sa
from castad_contracts import brief, envelope, events, topology
from castad_runtime import consumer, db, inbox, outbox, tables
from castad_runtime.stage import cancellation, handlers, leases, machine, outcomes, repository, runner
from castad_testkit import briefs

from tests.support import waits

T = TypeVar("T")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def pipeline_requested(pipeline_id: str | None = None, **fields: Any) -> events.PipelineRequested:
    return events.PipelineRequested(
        **{"pipeline_id": pipeline_id or str(uuid.uuid4()), "brief": briefs.sample(), "requested_at": now(), **fields}
    )


def requested_envelope(pipeline_id: str | None = None) -> envelope.Envelope:
    return envelope.wrap(pipeline_requested(pipeline_id), events.PIPELINE_REQUESTED, "/castad/api")


def lyric_started(pipeline_id: str, attempt: int, stage: events.Stage = events.Stage.LYRIC) -> events.StageStarted:
    """A stage fact the gateway's queue is bound to; `attempt` doubles as a sequence number."""
    return events.StageStarted(
        pipeline_id=pipeline_id,
        stage=stage,
        job_id=str(uuid.uuid4()),
        attempt=attempt,
        started_at=now(),
        worker=f"{stage.value}@test:1",
    )


def write_events(engine: sa.Engine, payloads: Iterable[events.Payload], event_type: str) -> list[envelope.Envelope]:
    """Each payload in its own committed transaction, as a service writes them.

    With its type's producer's source (the relay publishes a type only from its producer's database, with that
    source).
    """
    written = []
    for payload in payloads:
        with db.transaction(engine) as conn:
            written.append(outbox.add(conn, payload, event_type, topology.SOURCES[topology.PRODUCERS[event_type]]))
    return written


# Lyric's own, and routed nowhere once `hear_only_started` narrowed the gateway's binding: the broker returns it.
UNHEARD = events.stage_event(events.Stage.LYRIC, "retrying")


def hear_only_started(amqp: Amqp, topo: topology.Topology, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's queue takes lyric.started alone instead of lyric.*: lyric's other facts reach no queue.

    Bound so on the broker, and so known to the contracts of a relay run in this process, which would otherwise
    bind lyric.* to the gateway's queue again before it publishes one of them."""
    started = events.stage_event(events.Stage.LYRIC, "started")
    keys = tuple(started if key == "lyric.*" else key for key in topology.SUBSCRIPTIONS["api"].routing_keys)
    monkeypatch.setitem(topology.SUBSCRIPTIONS, "api", topology.Subscription("api", keys))
    amqp.channel.queue_bind(topo.queue("api"), topo.exchange, started)
    amqp.channel.queue_unbind(topo.queue("api"), topo.exchange, "lyric.*")


def write_unroutable(engine: sa.Engine, pipeline_id: str) -> uuid.UUID:
    """A row of lyric's outbox that no queue takes (after `hear_only_started`): RabbitMQ returns it, as unroutable."""
    env = envelope.Envelope(source=topology.SOURCES["lyric"], type=UNHEARD, subject=pipeline_id, data={})
    with db.transaction(engine) as conn:
        outbox.append(conn, env)
    return env.id


def output() -> outcomes.Output:
    """What a lyric attempt returns: an artifact and the lyrics."""
    artifact = events.Artifact(uri="file:///lyric.txt", sha256="0" * 64, size=1, media_type="text/plain")
    lyrics = events.Lyrics(
        title="바다", language=brief.Language.KOREAN, sections=(events.LyricSection(kind="verse", lines=("라",)),)
    )
    return outcomes.Output(artifact, {"lyrics": lyrics})


def succeed(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
    return output()


def stage_runner(
    engine: sa.Engine,
    work: runner.Work,
    *,
    worker: str = "worker-a",
    max_attempts: int = 3,
    backoff_s: float = 0.05,
    lease_s: float = 30.0,
    attempt_timeout_s: float = 10.0,
    cancel_grace_s: float = 5.0,
    clock: leases.Clock = leases.clock,
    registry: events.Registry = events.REGISTRY,
) -> runner.StageRunner:
    """The lyric stage's runner; `registry`: the event versions its release knows."""
    policy = machine.RetryPolicy(max_attempts, backoff_s, max(backoff_s, 60.0), jitter=0.0)
    limits = runner.Limits(policy, lease_s, attempt_timeout_s, cancel_grace_s)
    return runner.StageRunner(
        events.Stage.LYRIC,
        engine,
        work,
        events.LyricCompleted,
        limits,
        worker,
        rng=random.Random(0),
        clock=clock,
        registry=registry,
    )


class Counted:
    """Wraps a handler; counts the deliveries it finished handling (with or without an error)."""

    def __init__(self, handler: consumer.Handler) -> None:
        self.handler = handler
        self.finished = 0
        self._lock = threading.Lock()

    def __call__(self, env: envelope.Envelope, payload: events.Payload) -> None:
        try:
            self.handler(env, payload)
        finally:
            with self._lock:
                self.finished += 1


def stage_trigger_handler(engine: sa.Engine, fail_first: bool = False) -> consumer.Handler:
    """The lyric stage's pipeline.requested handler, as castad_runtime.stage.service wires it.

    With `fail_first`, the first delivery loses its connection before the commit (its job is not created).
    """
    on_trigger = handlers.StageHandlers(
        engine, stage_runner(engine, succeed), handlers.WakeOnly(lambda: None)
    ).on_trigger
    failed: list[bool] = []

    def handle(env: envelope.Envelope, payload: events.Payload) -> None:
        if fail_first and not failed:
            failed.append(True)
            with db.transaction(engine) as conn:
                inbox.first_delivery(conn, env)
                raise ConnectionError("database went away before the commit")
        on_trigger(env, payload)

    return handle


@dataclasses.dataclass(frozen=True)
class OutboxRow:
    id: int
    event_id: uuid.UUID
    pipeline_id: str
    routing_key: str
    published_at: dt.datetime | None


def outbox_rows(engine: sa.Engine) -> list[OutboxRow]:
    t = tables.outbox
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.c.id, t.c.event_id, t.c.pipeline_id, t.c.routing_key, t.c.published_at).order_by(t.c.id)
        )
        return [OutboxRow(**row._mapping) for row in rows]


def all_published(engine: sa.Engine) -> bool:
    rows = outbox_rows(engine)
    return bool(rows) and all(row.published_at is not None for row in rows)


def count(engine: sa.Engine, table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one()


@dataclasses.dataclass(frozen=True)
class Delivered:
    routing_key: str
    body: bytes
    properties: pika.BasicProperties

    @property
    def document(self) -> dict[str, Any]:
        return json.loads(self.body)

    @property
    def headers(self) -> dict[str, Any]:
        return self.properties.headers or {}

    @property
    def event_id(self) -> uuid.UUID:
        return uuid.UUID(self.document["id"])


class Amqp:
    """A plain pika connection for the test's side of the broker: publish, read a queue."""

    def __init__(self, amqp_url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()

    def publish(self, exchange: str, routing_key: str, body: bytes, message_id: str | None = None) -> None:
        properties = pika.BasicProperties(delivery_mode=2, message_id=message_id, content_type="application/json")
        self.channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)

    def take_all(self, queue: str) -> list[Delivered]:
        """Every message now in the queue, in queue order (removed from it)."""
        taken = []
        while True:
            method, properties, body = self.channel.basic_get(queue, auto_ack=True)
            if method is None:
                return taken
            taken.append(Delivered(method.routing_key, body, properties))

    def take(self, queue: str, n: int, timeout: float = 10.0) -> list[Delivered]:
        """Wait until `n` messages were taken from the queue."""
        taken: list[Delivered] = []

        def enough() -> bool:
            taken.extend(self.take_all(queue))
            return len(taken) >= n

        waits.until(enough, timeout_s=timeout, interval_s=0.05, what=f"{n} messages on {queue} (got {len(taken)})")
        return taken

    def depth(self, queue: str) -> int:
        return self.channel.queue_declare(queue, passive=True).method.message_count


class LoopThread:
    """An asyncio event loop on its own thread, for the relay's coroutines; closed with every task."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, fn: Callable[[], object]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def close(self) -> None:
        self.submit(self._cancel_everything()).result(timeout=15)
        self.submit(self.loop.shutdown_asyncgens()).result(timeout=5)
        self.submit(self.loop.shutdown_default_executor()).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()

    @staticmethod
    async def _cancel_everything() -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def statements_of(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    """The SELECT and DELETE statements on tables run on `engine` in the block, with their parameters."""
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if not executemany and statement.lstrip().startswith(("SELECT", "DELETE")) and "FROM" in statement:
            seen.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)


PLACEHOLDER = re.compile(r"%\((\w+)\)s")  # psycopg's named parameters
INDEX_IN_PLAN = re.compile(r"(?:Index Scan|Index Only Scan) (?:Backward )?(?:using|on) (\w+)")


def generic_plan(conn: sa.Connection, statement: str, parameters: dict[str, Any]) -> str:
    """The plan of a statement prepared for reuse, made without its parameters' values."""
    names = list(dict.fromkeys(PLACEHOLDER.findall(statement)))
    numbered = PLACEHOLDER.sub(lambda match: f"${names.index(match.group(1)) + 1}", statement)
    driver = conn.connection.driver_connection
    values = ", ".join(psycopg.sql.Literal(parameters[name]).as_string(driver) for name in names)
    conn.exec_driver_sql(f"PREPARE castad_probe AS {numbered}")
    try:
        plan = conn.exec_driver_sql(
            f"EXPLAIN EXECUTE castad_probe({values})" if names else "EXPLAIN EXECUTE castad_probe"
        )
        return "\n".join(row[0] for row in plan)
    finally:
        conn.exec_driver_sql("DEALLOCATE castad_probe")


def indexes_used(engine: sa.Engine, statements: Iterable[tuple[str, Any]]) -> set[str]:
    """The indexes PostgreSQL's generic plans of `statements` use when it may not scan a table whole."""
    used: set[str] = set()
    with engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        for statement, parameters in statements:
            used |= set(INDEX_IN_PLAN.findall(generic_plan(conn, statement, parameters)))
        conn.rollback()
    return used
