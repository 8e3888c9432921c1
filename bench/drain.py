"""E. Draining an outbox backlog: the relay against a raw pipelined publish with confirms.

An outbox of its own (`castad_bench_<run>_drain`, the lyric service's migrations) is filled
with `rows` real envelopes (`lyric.started`, `per_pipeline` events per pipeline, numbered by
their `attempt`) while no relay runs: the backlog an outage leaves. Then the relay
(`python -m castad_relay run`, its defaults, this outbox its only source) starts and drains it
to an exchange of this run, where one queue bound to `#` collects every message. The figure:
rows per second from the relay's start until the last row was marked published (after the
broker confirmed it). The queue is then read back to check that every pipeline's events
arrived in order, once each.

The raw peer publishes the same bodies with the same properties to the same exchange with
aiormq: one channel in confirm mode, `window` publishes in flight at a time, no database.

This host's speed drifts within minutes (see bench.paired), so the two run in rounds, who goes first
alternating, the outbox emptied between them: the target stands on the median of the ratios within
rounds, and the round of that median is the one shown in detail.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import aiormq
import pika
import psycopg
from castad_contracts import envelope, events
from castad_local import stack as stack_
from castad_lyric import service as lyric_service
from castad_runtime import migrations
from castad_testkit import scratch
from pamqp import commands as spec

from bench import cpu, paired

ROUTING_KEY = events.stage_event(events.Stage.LYRIC, "started")
# Whether any row is left to publish, and how many the relay parked (none should be: a parked row would
# end the drain short, or hold back its pipeline's later rows until the timeout).
LEFT = "SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at IS NULL AND parked_at IS NULL)"
PARKED = "SELECT count(*) FROM outbox WHERE published_at IS NULL AND parked_at IS NOT NULL"


class Drain:
    def __init__(self, cleanup: scratch.Cleanup, workdir: Any, rows: int, per_pipeline: int) -> None:
        self.cleanup = cleanup
        self.rows, self.per_pipeline = rows, per_pipeline
        self.database = f"castad_bench_{scratch.RUN_ID}_drain"
        self.url = scratch.database_url(self.database)
        self.namespace = f"bench-{scratch.RUN_ID}-drain"
        self.exchange = f"{self.namespace}.events"
        self.queue = f"{self.namespace}.tap"
        self.log = workdir / "logs" / "drain-relay.log"

    def setup(self) -> None:
        self.cleanup.push(f"drop {self.database}", lambda: migrations.drop_database(self.url))
        migrations.ensure_database(self.url)
        migrations.upgrade(self.url, lyric_service.MIGRATIONS)
        self.cleanup.push("delete the drain's exchange and queue", self._delete_topology)
        with self._channel() as channel:
            channel.exchange_declare(self.exchange, exchange_type="topic", durable=True)
            channel.queue_declare(self.queue, durable=True)
            channel.queue_bind(self.queue, self.exchange, routing_key="#")

    def _channel(self) -> Any:
        class Session:
            def __enter__(inner) -> Any:
                inner.connection = pika.BlockingConnection(pika.URLParameters(scratch.AMQP_URL))
                return inner.connection.channel()

            def __exit__(inner, *exc: object) -> None:
                inner.connection.close()

        return Session()

    def _delete_topology(self) -> None:
        with self._channel() as channel:
            channel.queue_delete(self.queue)
            channel.exchange_delete(self.exchange)

    def envelopes(self) -> list[envelope.Envelope]:
        """`rows` envelopes, `per_pipeline` for each pipeline, interleaved as concurrent pipelines write them."""
        pipelines = [str(uuid.uuid4()) for _ in range(self.rows // self.per_pipeline)]
        now = dt.datetime.now(dt.UTC)
        result = []
        for number in range(1, self.per_pipeline + 1):
            for pipeline_id in pipelines:
                payload = events.StageStarted(
                    pipeline_id=pipeline_id, stage=events.Stage.LYRIC, job_id=str(uuid.uuid4()), attempt=number,
                    started_at=now, worker="bench@drain",
                )  # fmt: skip
                traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
                result.append(envelope.wrap(payload, ROUTING_KEY, "/castad/lyric", traceparent))
        return result

    def fill(self, envs: list[envelope.Envelope]) -> float:
        """Write the backlog with COPY; seconds it took."""
        started = time.monotonic()
        with (
            psycopg.connect(scratch.dsn(self.url)) as conn,
            conn.cursor() as cursor,
            cursor.copy("COPY outbox (event_id, pipeline_id, routing_key, envelope) FROM STDIN") as copy,
        ):
            for env in envs:
                copy.write_row((env.id, env.subject, env.type, env.model_dump_json()))
        return time.monotonic() - started

    def relay(self, timeout_s: float = 600) -> dict[str, Any]:
        """Start the relay on the backlog; how fast it drained it."""
        env = {
            **os.environ,
            "CASTAD_AMQP_URL": scratch.AMQP_URL,
            "CASTAD_NAMESPACE": self.namespace,
            "CASTAD_RELAY_SOURCES": f"lyric={self.url}",
            "OTEL_TRACES_EXPORTER": "none",
        }
        self.log.parent.mkdir(parents=True, exist_ok=True)
        before = cpu.snapshot(cpu.postgres_backends(self.database))
        started = time.time()
        with self.log.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "castad_relay", "run"], env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            with psycopg.connect(scratch.dsn(self.url), autocommit=True) as conn:
                deadline = time.monotonic() + timeout_s
                while True:
                    # One look in the relay's own partial index (a count, or a filter it does not match,
                    # would read the whole table 20 times a second beside the relay it measures).
                    left = conn.execute(LEFT).fetchone()
                    if left is not None and not left[0]:
                        break
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the relay did not drain the backlog; log in {self.log}")
                    time.sleep(0.05)
                parked = conn.execute(PARKED).fetchone()
                if parked is not None and parked[0]:
                    raise RuntimeError(f"the relay parked {parked[0]} rows of the backlog; log in {self.log}")
                relay_cpu = cpu.used({}, cpu.snapshot(cpu.in_group(process.pid)))
                pg_cpu = cpu.used(before, cpu.snapshot(cpu.postgres_backends(self.database)))
                published = conn.execute("SELECT min(published_at), max(published_at) FROM outbox").fetchone()
                assert published is not None  # an aggregate without GROUP BY returns a row
                first, last = published
        finally:
            stack_.stop_group(process, 30)
        return {
            "rows": self.rows,
            "seconds_from_start": last.timestamp() - started,
            "seconds_publishing": (last - first).total_seconds(),
            "rate": self.rows / (last.timestamp() - started),
            "cpu_ms_per_1000_rows": {"relay": relay_cpu * 1e6 / self.rows, "postgres": pg_cpu * 1e6 / self.rows},
        }

    def check_order(self) -> dict[str, Any]:
        """Read the queue back: every row once, and each pipeline's events in the order they were written."""
        seen: dict[str, int] = {}
        out_of_order = duplicates = count = 0
        ids: set[str] = set()
        with self._channel() as channel:
            channel.basic_qos(prefetch_count=1000)
            for method, properties, body in channel.consume(self.queue, inactivity_timeout=5):
                if method is None:
                    break
                count += 1
                data = json.loads(body)
                if properties.message_id in ids:
                    duplicates += 1
                ids.add(properties.message_id)
                pipeline_id, number = data["subject"], data["data"]["attempt"]
                if number != seen.get(pipeline_id, 0) + 1:
                    out_of_order += 1
                seen[pipeline_id] = number
                channel.basic_ack(method.delivery_tag)
                if count == self.rows:
                    break
            channel.cancel()
        return {"received": count, "out_of_order": out_of_order, "duplicates": duplicates}

    def relay_round(self, envs: list[envelope.Envelope]) -> dict[str, Any]:
        """Fill the backlog, let the relay drain it, read the queue back.

        Then empty the outbox for the next round to write the same rows again.
        """
        measured = {"fill_seconds": self.fill(envs), "relay": self.relay(), "order": self.check_order()}
        with psycopg.connect(scratch.dsn(self.url), autocommit=True) as conn:
            conn.execute("TRUNCATE outbox")
        return measured

    def raw(self, envs: list[envelope.Envelope], window: int) -> dict[str, Any]:
        """The same messages with aiormq alone, `window` unconfirmed publishes at a time."""
        bodies = [
            (
                env.model_dump_json().encode(),
                spec.Basic.Properties(
                    delivery_mode=2, message_id=str(env.id), content_type="application/json",
                    headers={"traceparent": env.traceparent or ""},
                ),
            )
            for env in envs
        ]  # fmt: skip

        async def publish() -> float:
            connection = await aiormq.connect(scratch.AMQP_URL)
            try:
                channel = await connection.channel(publisher_confirms=True)
                started = time.perf_counter()
                for start in range(0, len(bodies), window):
                    await asyncio.gather(
                        *(
                            channel.basic_publish(body, exchange=self.exchange, routing_key=ROUTING_KEY,
                                                  properties=properties, mandatory=True)
                            for body, properties in bodies[start : start + window]
                        )
                    )  # fmt: skip
                return time.perf_counter() - started
            finally:
                await connection.close()

        seconds = asyncio.run(publish())
        with self._channel() as channel:
            channel.queue_purge(self.queue)
        return {"rows": len(bodies), "window": window, "seconds": seconds, "rate": len(bodies) / seconds}


def run(
    cleanup: scratch.Cleanup, workdir: Any, rows: int, per_pipeline: int, window: int, rounds: int
) -> dict[str, Any]:
    """`rounds` rounds of the relay's drain and the raw publish (odd: the median round is shown).

    The median round's figures, with every round's under `rounds`.
    """
    done: list[dict[str, Any]] = []
    with cleanup.scope():
        drain = Drain(cleanup, workdir, rows, per_pipeline)
        drain.setup()
        envs = drain.envelopes()
        for number in range(rounds):
            raw_first = number % 2 == 0
            measured: dict[str, Any] = {"first": "raw" if raw_first else "relay"}
            if raw_first:
                measured["raw"] = drain.raw(envs, window)
            measured.update(drain.relay_round(envs))
            if not raw_first:
                measured["raw"] = drain.raw(envs, window)
            measured["ratio"] = measured["relay"]["rate"] / measured["raw"]["rate"]
            done.append(measured)
            scratch.log.info(
                "drain round %d: relay %.0f rows/s, raw %.0f rows/s (%.2fx)",
                number + 1, measured["relay"]["rate"], measured["raw"]["rate"], measured["ratio"],
            )  # fmt: skip
    median = paired.median_of(done, lambda measured: measured["ratio"])
    return {**median, "per_pipeline": per_pipeline, "rounds": done}
