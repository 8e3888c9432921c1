"""Drains outbox tables into the topic exchange, with publisher confirms.

One task per source database. It holds a session advisory lock, so a second relay
replica waits as a hot standby instead of publishing the same rows. Only once it
leads does it LISTEN on the outbox channel (a standby that listened would never read
its notifications and so hold back PostgreSQL's notification queue, shared by the
whole server); it drains then, and whenever a writer's NOTIFY arrives (or, should
one be missed, every `fallback_poll_s`). A drain publishes a batch on one channel:
rows of different pipelines concurrently, the rows of one pipeline one after another,
each once the broker has confirmed the one before. After a row that is not confirmed
its pipeline's later rows are not sent; they wait for the next round with it, so no
consumer gets a pipeline's event before an earlier one. Only confirmed rows are
marked published. Any error leaves rows unpublished; the task reconnects and carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import defaultdict
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
        """Publish a batch; True for each row, in row order, that the broker confirmed as routed.

        Pipelines go out concurrently, each pipeline's rows in order and one at a time: a row is sent
        once the one before it is confirmed, and none after one that is not (nacked, returned as
        unroutable, timed out), so a consumer never gets a pipeline's row before an earlier one.
        """
        channel = await self.channel()
        # Per row: the broker's answer, the exception the publish raised, or None if it was not sent.
        outcomes: list[object] = [None] * len(rows)
        by_pipeline: defaultdict[str, list[int]] = defaultdict(list)
        for index, row in enumerate(rows):
            by_pipeline[row["pipeline_id"]].append(index)

        async def in_order(indexes: list[int]) -> None:
            for index in indexes:
                try:
                    outcomes[index] = await self._publish_one(channel, rows[index])
                except Exception as error:
                    outcomes[index] = error
                if not isinstance(outcomes[index], spec.Basic.Ack):
                    return

        await asyncio.gather(*(in_order(indexes) for indexes in by_pipeline.values()))
        confirmed = [isinstance(outcome, spec.Basic.Ack) for outcome in outcomes]
        failures = [outcome for outcome in outcomes if not isinstance(outcome, spec.Basic.Ack | None)]
        if failures:
            log.warning("%d of %d publishes unconfirmed: %r", confirmed.count(False), len(rows), failures[0])
            # A nack or an unroutable return leaves the channel usable; a timeout or an error may not.
            if any(not isinstance(failure, spec.Basic.Nack | aiormq.exceptions.PublishError) for failure in failures):
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
            except (psycopg.Error, OSError) as error:
                log.warning("relay %s: database unavailable (%s); retrying", self.name, error)
            except Exception:
                # Anything else is a bug, but it must not end this database's relay for good.
                # (Cancellation is not an Exception: it still ends the task.)
                log.exception("relay %s: unexpected error; retrying", self.name)
            await asyncio.sleep(self.config.retry_delay_s)

    async def _run(self) -> None:
        async with (
            await psycopg.AsyncConnection.connect(self.url, autocommit=True) as listener,
            await psycopg.AsyncConnection.connect(self.url, autocommit=True) as worker,
        ):
            log.info("relay %s: waiting for leadership", self.name)
            await worker.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
            log.info("relay %s: leading", self.name)
            # Listen only now (see the module docstring); the first drain below picks up every row
            # committed before the LISTEN, whose NOTIFY this session did not get.
            await listener.execute(f"LISTEN {db.OUTBOX_CHANNEL}")
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
