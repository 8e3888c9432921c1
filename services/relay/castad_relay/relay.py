"""Drains outbox tables into the topic exchange, with publisher confirms.

One task per source database. It holds a session advisory lock, so a second relay
replica waits as a hot standby instead of publishing the same rows. It LISTENs on
the outbox channel and drains whenever a writer's NOTIFY arrives (or, should one be
missed, every `fallback_poll_s`). A drain publishes a batch in insertion order on
one channel without waiting between messages, then waits for all confirms and marks
only the confirmed rows; a pipeline whose row was not confirmed keeps its later
rows for the next round, so order per pipeline holds. Any database or broker error
leaves rows unpublished; the task reconnects and carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import aiormq
import psycopg
from castad_contracts import envelope as envelope_
from castad_contracts import topology
from castad_runtime import db, telemetry
from opentelemetry import trace
from pamqp import commands as spec

from castad_relay import settings as settings_

log = logging.getLogger(__name__)
LOCK_KEY = 0x0CA57AD  # one advisory lock id per database: the relay leader's


def _psycopg_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


class Publisher:
    """A confirm-mode channel on one connection, reopened after any failure."""

    def __init__(self, amqp_url: str, exchange: str, confirm_timeout_s: float) -> None:
        self.amqp_url = amqp_url
        self.exchange = exchange
        self.confirm_timeout_s = confirm_timeout_s
        self._connection: aiormq.abc.AbstractConnection | None = None
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._lock = asyncio.Lock()

    async def channel(self) -> aiormq.abc.AbstractChannel:
        async with self._lock:
            if self._channel is None or self._channel.is_closed:
                await self.close()
                # aiormq has no handshake timeout: a broker that accepts the connection but never
                # answers (a network partition) would otherwise hold every source's relay forever.
                async with asyncio.timeout(self.confirm_timeout_s):
                    self._connection = await aiormq.connect(self.amqp_url)
                    self._channel = await self._connection.channel(publisher_confirms=True)
            return self._channel

    async def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    async def publish(self, rows: Sequence[dict[str, Any]]) -> list[bool]:
        """Publish in order; True for each row the broker confirmed as routed."""
        channel = await self.channel()
        tasks = [asyncio.ensure_future(self._publish_one(channel, row)) for row in rows]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        confirmed = [isinstance(result, spec.Basic.Ack) for result in results]
        if not all(confirmed):
            failure = next(r for r in results if not isinstance(r, spec.Basic.Ack))
            log.warning("%d of %d publishes unconfirmed: %r", confirmed.count(False), len(rows), failure)
            if isinstance(failure, BaseException) and not isinstance(failure, aiormq.exceptions.PublishError):
                await self.close()
        return confirmed

    async def _publish_one(self, channel: aiormq.abc.AbstractChannel, row: dict[str, Any]) -> object:
        env = row["envelope"]
        parent = telemetry.context_from(env.get("traceparent"), env.get("tracestate"))
        tracer = telemetry.tracer("castad.relay")
        with tracer.start_as_current_span(
            f"publish {row['routing_key']}",
            context=parent,
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.message.id": str(row["event_id"]),
                "castad.pipeline_id": row["pipeline_id"],
            },
        ):
            # The consumer continues the trace from this publish span.
            traceparent, tracestate = telemetry.current_trace_headers()
            body = dict(env, traceparent=traceparent, tracestate=tracestate)
            headers: dict[str, Any] = {k: v for k, v in (("traceparent", traceparent), ("tracestate", tracestate)) if v}
            properties = spec.Basic.Properties(
                content_type=envelope_.CONTENT_TYPE,
                delivery_mode=2,  # persistent
                message_id=str(row["event_id"]),
                message_type=row["routing_key"],
                timestamp=row["created_at"],
                headers=headers,
            )
            return await channel.basic_publish(
                json.dumps(body, separators=(",", ":")).encode(),
                exchange=self.exchange,
                routing_key=row["routing_key"],
                properties=properties,
                mandatory=True,
                timeout=self.confirm_timeout_s,
            )


def publishable(rows: Sequence[dict[str, Any]], confirmed: Sequence[bool]) -> list[int]:
    """Ids to mark published: confirmed rows not preceded by an unconfirmed row of their pipeline."""
    blocked: set[str] = set()
    ids = []
    for row, ok in zip(rows, confirmed, strict=True):
        if not ok:
            blocked.add(row["pipeline_id"])
        elif row["pipeline_id"] not in blocked:
            ids.append(row["id"])
    return ids


class SourceRelay:
    """Relays one database's outbox."""

    def __init__(self, url: str, publisher: Publisher, config: settings_.RelaySettings) -> None:
        self.url = _psycopg_url(url)
        self.name = self.url.rsplit("/", 1)[-1]
        self.publisher = publisher
        self.config = config
        self.published = 0

    async def run_forever(self) -> None:
        while True:
            try:
                await self._run()
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError) as error:
                log.warning("relay %s: database unavailable (%s); retrying", self.name, error)
            await asyncio.sleep(self.config.retry_delay_s)

    async def _run(self) -> None:
        async with (
            await psycopg.AsyncConnection.connect(self.url, autocommit=True) as listener,
            await psycopg.AsyncConnection.connect(self.url, autocommit=True) as worker,
        ):
            await listener.execute(f"LISTEN {db.OUTBOX_CHANNEL}")
            log.info("relay %s: waiting for leadership", self.name)
            await worker.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
            log.info("relay %s: leading", self.name)
            while True:
                await self._drain(worker)
                async for _ in listener.notifies(timeout=self.config.fallback_poll_s, stop_after=1):
                    pass

    async def _drain(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            rows = await self._pending(conn)
            if not rows:
                return
            try:
                confirmed = await self.publisher.publish(rows)
            except (TimeoutError, aiormq.exceptions.AMQPError, OSError) as error:
                log.warning("relay %s: broker unavailable (%s); rows wait", self.name, error)
                await self.publisher.close()
                await asyncio.sleep(self.config.retry_delay_s)
                continue
            ids = publishable(rows, confirmed)
            if ids:
                await conn.execute("UPDATE outbox SET published_at = now() WHERE id = ANY(%s)", (ids,))
                self.published += len(ids)
            if len(ids) < len(rows):
                await asyncio.sleep(self.config.retry_delay_s)

    async def _pending(self, conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
        cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cursor.execute(
            "SELECT id, event_id, pipeline_id, routing_key, envelope, created_at FROM outbox"
            " WHERE published_at IS NULL ORDER BY id LIMIT %s",
            (self.config.batch_size,),
        )
        return await cursor.fetchall()


async def run(config: settings_.RelaySettings, stop: asyncio.Event) -> None:
    topo = topology.Topology(config.namespace)
    publisher = Publisher(config.amqp_url, topo.exchange, config.confirm_timeout_s)
    relays = [SourceRelay(url, publisher, config) for url in config.sources]
    tasks = [asyncio.create_task(relay.run_forever(), name=relay.name) for relay in relays]
    started = time.monotonic()
    try:
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await publisher.close()
        total = sum(relay.published for relay in relays)
        log.info("relay published %d events in %.0f s", total, time.monotonic() - started)
