"""Drains outbox tables into the topic exchange, with publisher confirms.

One task per source database, publishing only while it holds the database's lease, the leases
spread over the relay's replicas (castad_relay.leadership); how a drain orders, marks and backs
off rows: docs/concepts/outbox.md.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from typing import Any

import aiormq
import psycopg
from castad_contracts import topology
from castad_runtime import backoff, db, process, redact
from castad_runtime import metrics as runtime_metrics

from castad_relay import bindings as bindings_
from castad_relay import connection, leadership, ownership, pushback, readers, statements
from castad_relay import metrics as metrics_
from castad_relay import publisher as publisher_
from castad_relay import settings as settings_

log = logging.getLogger(__name__)
PUBLISHED = publisher_.Sent.PUBLISHED
QueueMissing = publisher_.QueueMissing


def publishable(rows: Sequence[dict[str, Any]], results: Sequence[publisher_.RowResult]) -> list[int]:
    """Ids to mark published: confirmed rows not preceded by an unconfirmed row of their pipeline."""
    blocked: set[str] = set()
    ids = []
    for row, result in zip(rows, results, strict=True):
        if result is not PUBLISHED:
            blocked.add(row["pipeline_id"])
        elif row["pipeline_id"] not in blocked:
            ids.append(row["id"])
    return ids


class SourceRelay:
    """Relays one database's outbox."""

    def __init__(
        self,
        service: str,
        url: str,
        publisher: publisher_.Publisher,
        config: settings_.RelaySettings,
        dead_letter_exchange: str,
        metrics: metrics_.RelayMetrics | None = None,
        holder: str | None = None,
        spread: leadership.Spread | None = None,
    ) -> None:
        self.url = url
        self.dead_letter_exchange = dead_letter_exchange
        self.name = db.database_name(url)
        self.source = service  # whose outbox this is (the relay's setting says): what it may publish from it
        self.topology = topology.Topology(config.namespace)
        holder = holder or leadership.Lease.holder_name(process.worker_id("relay"))
        self.lease = leadership.Lease(holder, config.lease_s, spread=spread)
        self.metrics = metrics or metrics_.RelayMetrics(runtime_metrics.registry())
        self.publisher = publisher
        self.config = config
        self.sessions = db.SessionLimits.of(config)
        self.published = 0
        self.parked = 0
        self._suspects: set[int] = set()  # rows in flight when their channel closed: tried alone next
        self._confirmed: list[int] = []  # rows the broker confirmed, to be marked published
        self._backing_off = True  # some row may wait for its retry_at (ask NEXT_RETRY_IN); reset by each leader
        self._rng = random.Random()

    async def run_forever(self) -> None:
        while True:
            try:
                await self._run()
            except (psycopg.errors.UndefinedTable, psycopg.errors.InsufficientPrivilege) as error:
                # Not an outage: the database was not migrated to this relay's version, or not granted to it.
                log.error(
                    "relay %s: %s; migrate the service's database (and grant the relay its tables) before the relay"
                    " runs this version (docs/deploy.md); retrying",
                    self.name,
                    redact.describe(error),
                )
            except (psycopg.Error, OSError, TimeoutError) as error:
                log.warning("relay %s: database unavailable (%s); retrying", self.name, redact.describe(error))
            except leadership.HandedBack as error:
                log.info("relay %s: %s, for another relay to lead", self.name, error)
            except leadership.LostLeadership as error:
                log.warning("relay %s: %s; waiting to lead again", self.name, error)
            except Exception:
                # Anything else is a bug, but it must not end this database's relay for good.
                log.exception("relay %s: unexpected error; retrying", self.name)
            except asyncio.CancelledError:
                if publisher_.stopping():  # the relay stops: this ends the task
                    raise
                # Not a stop of this relay (a library passed on its own cancellation): it must not end it either.
                log.exception("relay %s: cancelled from below; retrying", self.name)
            await asyncio.sleep(self.config.retry_delay_s)

    async def _run(self) -> None:
        async with await self._connect() as keeper:
            log.info("relay %s: waiting for leadership", self.name)
            await self.lease.wait_until_taken(keeper)
            log.info("relay %s: leading (term %s)", self.name, self.lease.term)
            async with await self._connect() as listener, await self._connect() as worker:
                await worker.execute(statements.LAZY_COMMITS)
                # Listen only now (see the module docstring); the first drain below picks up every row
                # committed before the LISTEN, whose NOTIFY this session did not get.
                await listener.execute(f"LISTEN {db.OUTBOX_CHANNEL}")
                self._backing_off = True
                renewing = asyncio.create_task(self.lease.keep(keeper), name=f"lease {self.name}")
                try:
                    while True:
                        self.lease.check()
                        await self._drain(worker)
                        wait_s = (
                            await self._until_next_retry(worker) if self._backing_off else self.config.fallback_poll_s
                        )
                        await self._wait(listener, wait_s, renewing)
                finally:
                    renewing.cancel()
                    await self._mark_on_leaving(worker)
                    if publisher_.stopping() or self.lease.handing_back:
                        await self._release(keeper)

    async def _wait(self, listener: psycopg.AsyncConnection[Any], wait_s: float, renewing: asyncio.Task[None]) -> None:
        """Wait for a NOTIFY up to `wait_s`, or until the lease is lost or to be handed back.

        A lease handed back is so ended at once, not at the next drain."""
        waiting = asyncio.ensure_future(db.notifications(listener, wait_s))
        try:
            await asyncio.wait((waiting, renewing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiting.done():
                waiting.cancel()
                await asyncio.wait((waiting,))
        if not waiting.cancelled():
            waiting.result()  # the listener's error, if it failed
        if renewing.done():
            renewing.result()  # the renewal's error, if one it does not handle ended it

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        return await connection.database(self.url, self.sessions)

    async def _release(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """End the lease at once, so that another relay takes over without waiting for it to run out.

        A stopping relay does (and leaves the live ones), and one handing the lease back."""
        try:
            async with asyncio.timeout(self.config.retry_delay_s):
                await self.lease.release(conn)
                if publisher_.stopping():
                    await self.lease.leave(conn)
        except (psycopg.Error, OSError, TimeoutError) as error:
            log.warning("relay %s: lease left to run out (%s)", self.name, redact.describe(error))

    async def _mark(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Mark the confirmed rows published, if any wait for it."""
        if self._confirmed:
            await conn.execute(statements.MARK_PUBLISHED, {"marked": self._confirmed}, prepare=db.REPLAN)
            self.published += len(self._confirmed)
            self.metrics.published.labels(self.source).inc(len(self._confirmed))
            self._confirmed = []

    async def _mark_on_leaving(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A relay that stops or lost its database marks what it can: a row left unmarked is only sent again."""
        if not self._confirmed or conn.closed:
            self._confirmed = []
            return
        try:
            async with asyncio.timeout(self.config.retry_delay_s):
                await self._mark(conn)
        except (psycopg.Error, OSError, TimeoutError) as error:
            log.warning(
                "relay %s: %d confirmed rows left unmarked (%s); they will be sent again",
                self.name,
                len(self._confirmed),
                redact.describe(error),
            )
            self._confirmed = []

    async def _drain(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            self.lease.check()
            fetched = await self._pending(conn)
            if not fetched:
                return
            suspects = [row for row in fetched if row["id"] in self._suspects]
            rows = suspects or fetched
            self.metrics.batches.labels(self.source).observe(len(rows))
            try:
                if suspects:
                    results = [await self._publish_alone(row) for row in rows]
                else:
                    results = await self.publisher.publish(rows, self.lease.held, self._refusal)
            except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as error:
                log.warning("relay %s: broker unavailable (%s); rows wait", self.name, redact.describe(error))
                self.metrics.failures.labels(self.source, metrics_.BROKER_UNAVAILABLE).inc(len(rows))
                await self.publisher.close()
                await asyncio.sleep(self.config.retry_delay_s)
                continue
            await self._settle(conn, rows, results)
            await self._mark(conn)
            if any(result is None for result in results):  # broker trouble, not a refused row
                await asyncio.sleep(self.config.retry_delay_s)
            elif not suspects and len(fetched) < self.config.batch_size and publisher_.Sent.SUSPECT not in results:
                # That was all: rows committed since then have their NOTIFY waiting for the listener.
                return

    def _refusal(self, row: dict[str, Any]) -> str | None:
        return ownership.refusal(self.source, row, self.topology)

    async def _publish_alone(self, row: dict[str, Any]) -> publisher_.RowResult:
        """A suspect on a channel of its own: if the channel closes on it again, it is to blame."""
        [result] = await self.publisher.publish([row], self.lease.held, self._refusal)
        if result is publisher_.Sent.SUSPECT:
            return publisher_.Refused(f"the broker closed its channel: {self.publisher.closes.pop(row['id'], '')}")
        return result

    async def _settle(
        self, conn: psycopg.AsyncConnection[Any], rows: Sequence[dict[str, Any]], results: list[publisher_.RowResult]
    ) -> None:
        self._confirmed += publishable(rows, results)
        for result in results:
            reason = _failure(result)
            if reason is not None:
                self.metrics.failures.labels(self.source, reason).inc()
        waiting = {
            row["id"]: (result.reason(), self._waits_for(result))
            for row, result in zip(rows, results, strict=True)
            if isinstance(result, publisher_.Waiting)
        }
        if waiting:
            await self._hold_waiting(conn, waiting)
        for row, result in zip(rows, results, strict=True):
            if result is publisher_.Sent.SUSPECT:
                self._suspects.add(row["id"])
                continue
            self._suspects.discard(row["id"])
            self.publisher.closes.pop(row["id"], None)
            if isinstance(result, publisher_.Refused):
                await self._refused(conn, row, result.reason, result.final)

    def _waits_for(self, result: publisher_.QueueMissing | readers.Unread | pushback.PushedBack) -> float:
        """How long a held row waits.

        For a queue: a moment; for a reader: until the readers' word is looked at again; for a destination that
        refuses publishes: until its next probe."""
        if isinstance(result, readers.Unread):
            return max(self.config.retry_delay_s, readers.UNREAD_RECHECK_S)
        if isinstance(result, pushback.PushedBack):
            return result.wait_s
        return self.config.retry_delay_s

    async def _hold_waiting(self, conn: psycopg.AsyncConnection[Any], waiting: dict[int, tuple[str, float]]) -> None:
        """Rows waiting for a queue or a reader (row id -> why, and for how long), uncharged; the others go on."""
        self._backing_off = True
        for reason, delay_s in set(waiting.values()):
            ids = [row_id for row_id, held in waiting.items() if held == (reason, delay_s)]
            params = {"ids": ids, "reason": reason, "delay_s": delay_s, "term": self.lease.term}
            await conn.execute(statements.WAIT, params)

    async def _refused(
        self, conn: psycopg.AsyncConnection[Any], row: dict[str, Any], reason: str, final: bool = False
    ) -> None:
        """Back a refused row off, or park it.

        Once its tries are used up, or at once when it is never to be sent (`final`).
        """
        self._backing_off = True
        tries = row["publish_attempts"] + 1
        delay_s = backoff.exponential_s(
            tries - 1, self.config.retry_delay_s, self.config.publish_backoff_max_s, jitter=0.5, rng=self._rng
        )
        # Parked only once the operators were told (a notice in the dead-letter queue, which the gateway
        # records); if that fails, the row is tried again and the notice with it.
        why = (
            f"parked, its outbox may not publish it: {reason}" if final else f"parked after {tries} refusals: {reason}"
        )
        park = (
            (final or tries >= self.config.max_publish_attempts)
            and self.lease.held()
            and await self._tell_operators(row, why)
        )
        async with conn.transaction():
            await conn.execute(statements.DURABLY)
            await conn.execute(
                statements.REFUSED,
                {"id": row["id"], "reason": reason, "delay_s": delay_s, "park": park, "term": self.lease.term},
            )
        if park:
            self.parked += 1
            log.error(
                "relay %s: event %s (%s) %s; %d parked since start",
                self.name,
                row["event_id"],
                row["routing_key"],
                why,
                self.parked,
            )
        else:
            log.warning(
                "relay %s: event %s (%s) refused (%s); try %d of %d in %.1f s",
                self.name,
                row["event_id"],
                row["routing_key"],
                reason,
                tries + 1,
                self.config.max_publish_attempts,
                delay_s,
            )

    async def _tell_operators(self, row: dict[str, Any], why: str) -> bool:
        headers = {
            "x-castad-reason": why,
            "x-castad-service": "relay",
            "x-castad-source": self.name,
            "x-castad-parked-event": str(row["event_id"]),
        }
        body = publisher_.envelope_body(row["envelope"], row["traceparent"], row["tracestate"])
        # One id per version of the row: told again after a park that did not commit (a session ended inside the
        # refusal's transaction, a lost commit), the gateway records the notice once; a row republished and parked
        # again is a version of its own, and a notice of its own.
        message_id = f"parked:{row['event_id']}:{row['version']}"
        return await self.publisher.publish_dead_letter(self.dead_letter_exchange, body, headers, message_id)

    async def _pending(self, conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
        """The next rows to publish."""
        cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cursor.execute(statements.PENDING, {"limit": self.config.batch_size})
        return [publisher_.taken_apart(row) for row in await cursor.fetchall()]

    async def _until_next_retry(self, conn: psycopg.AsyncConnection[Any]) -> float:
        """How long to wait for a NOTIFY before draining anyway.

        Until the first row that backs off is due. Asked only while rows may back off (since the start, or a
        refusal).
        """
        cursor = await conn.execute(statements.NEXT_RETRY_IN)
        row = await cursor.fetchone()
        due_in = row[0] if row else None
        if due_in is None:
            self._backing_off = False
            return self.config.fallback_poll_s
        return min(self.config.fallback_poll_s, max(float(due_in), 0.0) + 0.01)


def _failure(result: publisher_.RowResult) -> str | None:
    """Why a row was not published, for the metrics (None: it was, or it was only held back behind one)."""
    if isinstance(result, publisher_.Refused):
        return metrics_.FORBIDDEN if result.final else metrics_.REFUSED
    if result is publisher_.Sent.SUSPECT:
        return metrics_.CHANNEL_CLOSED
    if isinstance(result, QueueMissing):
        return metrics_.QUEUE_MISSING
    if isinstance(result, readers.Unread):
        return metrics_.UNREAD
    if isinstance(result, pushback.PushedBack):
        return metrics_.NACKED if result.sent else metrics_.PUSHED_BACK
    if result is None:
        return metrics_.BROKER_UNAVAILABLE
    return None


async def run(
    config: settings_.RelaySettings, stop: asyncio.Event, metrics: metrics_.RelayMetrics | None = None
) -> None:
    topo = topology.Topology(config.namespace)
    metrics = metrics or metrics_.RelayMetrics(runtime_metrics.registry())
    # The queues are declared by set-up and by their services; the relay binds them to what they take (`bindings`).
    publisher = publisher_.Publisher(
        config.amqp_url,
        topo.exchange,
        config.confirm_timeout_s,
        config.max_message_bytes,
        metrics.confirms,
        bindings_.Bindings(topo, retry_s=config.retry_delay_s),
        # What the consumers read is in their own databases: the sources of this relay.
        readers.Readers(config.sources, db.SessionLimits.of(config)),
        pushback.PushBack(first_s=config.retry_delay_s),
    )
    # One holder name for all its leases: the other relays count it once among the live ones.
    holder = leadership.Lease.holder_name(process.worker_id("relay"))
    spread = leadership.Spread(len(config.sources), config.lease_s)
    relays = [
        SourceRelay(service, url, publisher, config, topo.dead_letter_exchange, metrics, holder, spread)
        for service, url in config.sources.items()
    ]
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
