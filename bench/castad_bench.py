"""A. Castad end to end with instant providers, every service its own process.

One isolated installation per run, like the tests': a database per service
(`castad_bench_<run>_<service>`, migrated by castad_runtime.migrations through
castad_local.stack.prepare), its own RabbitMQ namespace (`bench-<run>`), its own artifacts
directory, and api, relay, lyric, song and video started from infra/local/Procfile by
castad_local.stack.Stack with `CASTAD_<STAGE>_PROVIDER=instant`. Everything else keeps its
documented default.

Timestamps all come from one host clock: PostgreSQL's (now(), clock_timestamp()) and
Python's time.time() are both CLOCK_REALTIME of this machine.

- commit: during the idle run only, a deferred constraint trigger on each outbox, added
  by the harness to its own databases, records clock_timestamp() per row when the
  writing transaction COMMITs (deferred triggers fire at COMMIT, before the commit's WAL
  flush). outbox.created_at is now() = the start of the writing transaction, earlier.
- notify seen: a LISTEN connection of the harness on each database, next to the relay's.
- broker routed: arrival on a tap queue of the harness bound to the exchange with `#`.
- published: outbox.published_at, set by the relay once RabbitMQ confirmed the row's batch.
- handler start: inbox.received_at in the consuming service = now() of the handler's
  transaction, whose first statement is the inbox insert.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import functools
import json
import os
import pathlib
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

import httpx
import httpx_sse
import pika
import psycopg
from castad_api import keys
from castad_contracts import api, brief, events, topology
from castad_local import access
from castad_local import stack as stack_
from castad_runtime import db, messaging, migrations
from castad_testkit import briefs, handoffs, latency, scratch

from bench import commits, cpu

SERVICES = topology.WITH_DATABASE
STAGES = tuple(stage.value for stage in events.STAGE_ORDER)


def _ts(value: dt.datetime | None) -> float | None:
    return None if value is None else value.timestamp()


class Tap(threading.Thread):
    """Records when each event reaches a queue of ours bound to the exchange (`#`)."""

    def __init__(self, exchange: str) -> None:
        super().__init__(name="tap", daemon=True)
        self.connection = pika.BlockingConnection(pika.URLParameters(scratch.AMQP_URL))
        self.channel = self.connection.channel()
        declared = self.channel.queue_declare("", exclusive=True, auto_delete=True)
        self.queue = declared.method.queue
        self.channel.queue_bind(self.queue, exchange, routing_key="#")
        self.seen: dict[str, float] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        for method, properties, _ in self.channel.consume(self.queue, auto_ack=True, inactivity_timeout=0.1):
            if method is not None and properties.message_id:
                self.seen[properties.message_id] = time.time()
            if self.stopping.is_set():
                break

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        try:
            self.channel.cancel()
            self.connection.close()
        except Exception:
            pass


class NotifyClock(threading.Thread):
    """Records when outbox notifications of one database arrive (a LISTEN like the relay's)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="notify-clock", daemon=True)
        self.conn = psycopg.connect(scratch.dsn(url), autocommit=True)
        self.conn.execute(f"LISTEN {db.OUTBOX_CHANNEL}")
        self.arrivals: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            for _ in self.conn.notifies(timeout=0.1):
                self.arrivals.append(time.time())

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.conn.close()


@dataclasses.dataclass
class Record:
    pipeline_id: str
    posted: float  # client clock when the POST was sent
    streamed: float | None = None  # client clock when the terminal event arrived on the SSE stream


class CastadBench:
    def __init__(self, cleanup: scratch.Cleanup, workdir: pathlib.Path) -> None:
        self.cleanup = cleanup
        self.namespace = f"bench-{scratch.RUN_ID}"
        self.topology = topology.Topology(self.namespace)
        self.urls = {svc: scratch.database_url(f"castad_bench_{scratch.RUN_ID}_{svc}") for svc in SERVICES}
        self.databases = [url.rsplit("/", 1)[-1] for url in self.urls.values()]
        self.artifacts_dir = workdir / "artifacts"
        self.log_dir = workdir / "logs"
        self.port = stack_.free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.stack: stack_.Stack | None = None
        self.api_key = ""  # an admin key, made with the databases
        self._local = threading.local()
        self._clients: list[httpx.Client] = []

    def env(self) -> dict[str, str]:
        return {
            "CASTAD_AMQP_URL": scratch.AMQP_URL,
            "CASTAD_NAMESPACE": self.namespace,
            "CASTAD_ARTIFACTS_DIR": str(self.artifacts_dir),
            "CASTAD_RELAY_SOURCES": ",".join(f"{svc}={url}" for svc, url in self.urls.items()),
            "CASTAD_API_PORT": str(self.port),
            "OTEL_TRACES_EXPORTER": "none",
            # The per-key limit is counted as ever (the same statement), but set above any rate measured here.
            "CASTAD_API_CREATIONS_PER_MINUTE": "1000000",
            **{f"CASTAD_{svc.upper()}_DATABASE_URL": url for svc, url in self.urls.items()},
            **{f"CASTAD_{stage.upper()}_PROVIDER": "instant" for stage in STAGES},
        }

    # -- set-up and tear-down ------------------------------------------------------------

    def setup(self) -> None:
        for url in self.urls.values():
            self.cleanup.push(f"drop {url.rsplit('/', 1)[-1]}", functools.partial(migrations.drop_database, url))
        self.cleanup.push("delete topology", lambda: messaging.delete_topology(scratch.AMQP_URL, self.topology))
        self.cleanup.push("remove artifacts", lambda: shutil.rmtree(self.artifacts_dir, ignore_errors=True))
        for line in stack_.prepare(self.env()):
            scratch.log.info("castad: %s", line)
        self.api_key = access.create_key("bench", frozenset(keys.Scope), "the benchmark", self.env())

    def start(self, names: Iterable[str] = ()) -> None:
        """Start the processes `names`, then wait for the gateway.

        Each name is a service or a replica of one (`lyric-2`); none given: the Procfile's services.
        """
        self.stack = stack_.Stack(self.env(), self.log_dir)
        self.cleanup.push("stop services", self.stack.stop_all)
        for name in list(names) or list(self.stack.commands):
            self.stack.start(name)
        self.stack.wait_ready(self.base_url, timeout_s=120)
        self.cleanup.push("close clients", self._close_clients)

    def commit_clock(self, on: bool) -> None:
        for url in self.urls.values():
            with psycopg.connect(scratch.dsn(url), autocommit=True) as conn:
                conn.execute(handoffs.COMMIT_CLOCK if on else handoffs.COMMIT_CLOCK_OFF)

    # -- driving -------------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = httpx.Client(
                base_url=self.base_url, timeout=30, headers={"Authorization": f"Bearer {self.api_key}"}
            )
            self._local.client = client
            self._clients.append(client)  # list.append is atomic; closed at the end
        return client

    def _close_clients(self) -> None:
        for client in self._clients:
            client.close()

    def brief_of(self, number: int) -> brief.Brief:
        """The brief of the benchmark's `number`th pipeline."""
        return briefs.sample(f"Bench Cafe {number}")

    def submit(self, number: int) -> Record:
        body = self.brief_of(number).model_dump_json()
        headers = {"Content-Type": "application/json", "Idempotency-Key": f"bench-{uuid.uuid4()}"}
        posted = time.time()
        response = self._client().post("/v1/pipelines", content=body, headers=headers)
        if response.status_code != 202:
            raise RuntimeError(f"gateway answered {response.status_code}: {response.text[:300]}")
        return Record(response.json()["id"], posted)

    def follow(self, record: Record) -> str:
        """Read the pipeline's event stream until its terminal event; returns the final status."""
        with httpx_sse.connect_sse(self._client(), "GET", f"/v1/pipelines/{record.pipeline_id}/events") as source:
            for sse in source.iter_sse():
                if not sse.data:
                    continue
                status = json.loads(sse.data).get("pipeline_status")
                if status in api.ENDED:
                    record.streamed = time.time()
                    return str(status)
        raise RuntimeError(f"event stream of {record.pipeline_id} closed before a terminal event")

    def sequential(self, count: int, first: int, pause_s: float = 0.02) -> list[Record]:
        """One pipeline at a time: submit, follow its stream to the end, pause, next."""
        records = []
        for number in range(first, first + count):
            assert self.stack is not None
            self.stack.check_alive()
            record = self.submit(number)
            status = self.follow(record)
            if status != "SUCCEEDED":
                raise RuntimeError(f"pipeline {record.pipeline_id} ended {status}; logs in {self.log_dir}")
            records.append(record)
            time.sleep(pause_s)
        return records

    def wait_all(self, ids: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with psycopg.connect(scratch.dsn(self.urls["api"]), autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'SUCCEEDED'), count(*) FILTER (WHERE status = 'FAILED')"
                    " FROM pipelines WHERE id = ANY(%s::uuid[])",
                    (ids,),
                ).fetchone()
                assert row is not None
                done, failed = row
                if failed:
                    raise RuntimeError(f"{failed} pipelines FAILED; logs in {self.log_dir}")
                if done == len(ids):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{done} of {len(ids)} pipelines SUCCEEDED after {timeout_s} s")
                assert self.stack is not None
                self.stack.check_alive()
                time.sleep(0.05)

    def throughput(
        self, count: int, concurrency: int, first: int, timeout_s: float = 300, count_commits: bool = True
    ) -> dict[str, Any]:
        """Submit `count` pipelines, at most `concurrency` requests at a time, until all SUCCEEDED.

        Counting the commits (`commits_per_pipeline`) adds about 45 s of waiting for PostgreSQL's statistics.
        """
        counter = commits.Counter(self.databases) if count_commits else None
        if counter is not None:
            counter.start()
        before = self.cpu_snapshot()
        started = time.time()
        with concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="submit") as pool:
            records = list(pool.map(self.submit, range(first, first + count)))
        submitted = time.time()
        ids = [record.pipeline_id for record in records]
        self.wait_all(ids, timeout_s)
        after = self.cpu_snapshot()
        per_database = counter.stop(count) if counter is not None else None
        with psycopg.connect(scratch.dsn(self.urls["api"]), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT id::text, created_at, finished_at FROM pipelines WHERE id = ANY(%s::uuid[])", (ids,)
            ).fetchall()
        last = max(_ts(finished) or 0.0 for _, _, finished in rows)
        latencies = [(_ts(finished) or 0.0) - (_ts(created) or 0.0) for _, created, finished in rows]
        seconds = last - started
        videos_done = self._videos_done(ids)
        return {
            "pipelines": count,
            "concurrency": concurrency,
            "seconds": seconds,
            "rate": count / seconds,
            "submit_seconds": submitted - started,
            "latency_ms": latency.summary(latency.ms(latencies)),
            "stages_seconds": max(videos_done.values()) - started,
            "gateway_lag_ms": latency.summary(
                latency.ms([(_ts(finished) or 0.0) - videos_done[pid] for pid, _, finished in rows])
            ),
            "cpu_ms_per_pipeline": {name: cpu.used(before[name], after[name]) * 1000 / count for name in before},
            "commits_per_pipeline": (
                {svc: per_database[name] for svc, name in zip(self.urls, self.databases, strict=True)}
                if per_database is not None
                else None
            ),
        }

    def _videos_done(self, ids: list[str]) -> dict[str, float]:
        """When the video stage recorded each pipeline's success (`jobs.finished_at`).

        That is the transaction that also wrote its `completed` event: after that, only the relay's hop and the
        gateway's projection are left.
        """
        with psycopg.connect(scratch.dsn(self.urls["video"]), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pipeline_id, finished_at FROM jobs WHERE pipeline_id = ANY(%s) AND status = 'SUCCEEDED'",
                (ids,),
            ).fetchall()
        return {pipeline_id: finished.timestamp() for pipeline_id, finished in rows}

    def cpu_snapshot(self) -> dict[str, cpu.Snapshot]:
        assert self.stack is not None
        snapshots = {name: cpu.snapshot(cpu.in_group(p.pid)) for name, p in self.stack.processes.items()}
        snapshots["postgres"] = cpu.snapshot(cpu.postgres_backends(*self.databases))
        snapshots["rabbitmq"] = cpu.snapshot(cpu.rabbitmq())
        snapshots["client"] = cpu.snapshot(lambda pid, pgrp, cmdline: pid == os.getpid())
        return snapshots

    def idle_lot(self, count: int, first: int) -> latency.Summary:
        """End to end of `count` pipelines run one at a time (`sequential`), nothing else observed."""
        records = self.sequential(count, first)
        return end_to_end(self.urls["api"], {record.pipeline_id for record in records})

    # -- the idle run with its observers ----------------------------------------------------

    def idle(self, count: int, warmup: int) -> dict[str, Any]:
        """Time `count` pipelines one at a time by the databases alone, then `count` more with observers.

        After a warm-up, the first lot is timed by the databases alone, the second with the harness's observers of
        a handoff's parts running too. The observers share the machine with the services (a tap queue RabbitMQ
        routes every event to as well, a LISTEN per database that PostgreSQL wakes on every commit, threads of this
        process taking their share of the cores), so they slow the handoff they time: the totals come from the
        first lot, the parts from the second.
        """
        self.commit_clock(True)
        observers: list[Any] = []
        try:
            self.sequential(warmup, first=0)
            records = self.sequential(count, first=warmup)
            tap = Tap(self.topology.exchange)
            observers.append(tap)
            clocks = {svc: NotifyClock(url) for svc, url in self.urls.items()}
            observers.extend(clocks.values())
            for observer in observers:
                observer.start()
            observed = self.sequential(count, first=warmup + count)
        finally:
            for observer in observers:
                observer.stop()
            self.commit_clock(False)
        arrivals = {svc: clock.arrivals for svc, clock in clocks.items()}
        return analyse_idle(self.urls, records, observed, tap.seen, arrivals)


def _rows(url: str, query: str) -> list[dict[str, Any]]:
    with psycopg.connect(scratch.dsn(url), autocommit=True) as conn:
        cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cursor.execute(query).fetchall()


def _match_notifications(outbox: list[dict[str, Any]], arrivals: list[float], ids: set[str]) -> dict[str, float]:
    """Pair the k-th committed outbox transaction of a database with the k-th notification.

    The transactions are those for the pipelines `ids`, run while the notifications were listened to.

    Every outbox-writing transaction sends exactly one notification after its commit, and
    in a database one transaction follows the other while one pipeline runs at a time, so
    the orders agree. Returns nothing if the counts differ (a pairing would be a guess).
    """
    committed = sorted(
        (row["committed"], str(row["event_id"]))
        for row in outbox
        if row["committed"] is not None and row["pipeline_id"] in ids
    )
    if len(committed) != len(arrivals):
        scratch.log.warning("notify clock: %d commits, %d notifications; not paired", len(committed), len(arrivals))
        return {}
    return {event_id: arrival for (_, event_id), arrival in zip(committed, sorted(arrivals), strict=True)}


def analyse_idle(
    urls: dict[str, str],
    records: list[Record],
    observed: list[Record],
    tapped: dict[str, float],
    arrivals: dict[str, list[float]],
) -> dict[str, Any]:
    """Latencies of the unobserved `records`; the parts of a handoff from the `observed` ones."""
    ids = {record.pipeline_id for record in records}
    observed_ids = {record.pipeline_id for record in observed}
    events: dict[str, dict[str, Any]] = {}  # event id -> producer side
    received: dict[str, dict[str, float]] = {svc: {} for svc in SERVICES}  # consumer -> event id -> handler start
    notified: dict[str, float] = {}
    for svc, url in urls.items():
        outbox = _rows(
            url,
            "SELECT o.event_id, o.pipeline_id, o.routing_key, o.created_at, o.published_at,"
            " c.committed_at FROM outbox o LEFT JOIN bench_commit c USING (event_id)",
        )
        for row in outbox:
            row["committed"] = _ts(row["committed_at"])
        notified.update(_match_notifications(outbox, arrivals[svc], observed_ids))
        for row in outbox:
            event_id = str(row["event_id"])
            events[event_id] = {
                "event_id": event_id,
                "service": svc,
                "type": row["routing_key"],
                "pipeline_id": row["pipeline_id"],
                "created": _ts(row["created_at"]),
                "committed": row["committed"],
                "published": _ts(row["published_at"]),
                "notified": notified.get(event_id),
                "tapped": tapped.get(event_id),
            }
        for row in _rows(url, "SELECT event_id, received_at FROM inbox"):
            received[svc][str(row["event_id"])] = row["received_at"].timestamp()

    # Per database: when each row was on the broker but not yet confirmed to the relay.
    in_flight: dict[str, list[tuple[str, float, float]]] = {svc: [] for svc in SERVICES}
    for event in events.values():
        if event["tapped"] is not None and event["published"] is not None:
            in_flight[event["service"]].append((event["event_id"], event["tapped"], event["published"]))

    def hops(kinds: Iterable[tuple[str, str, str]], ids: set[str] = ids) -> dict[str, latency.Summary]:
        parts: dict[str, list[float]] = {
            k: []
            for k in (
                "total",
                "from_tx_start",
                "commit_to_notify",
                "notify_to_broker",
                "broker_to_handler",
                "confirmed",
                "total_while_relay_awaited_confirm",
            )
        }
        for event in events.values():
            if event["pipeline_id"] not in ids:
                continue
            for kind, producer, consumer in kinds:
                if event["type"] != kind or event["service"] != producer:
                    continue
                start = received[consumer].get(event["event_id"])
                if start is None or event["committed"] is None:
                    continue
                parts["total"].append(start - event["committed"])
                parts["from_tx_start"].append(start - event["created"])
                if event["published"] is not None:
                    parts["confirmed"].append(event["published"] - event["committed"])
                if event["notified"] is not None and event["tapped"] is not None:
                    parts["commit_to_notify"].append(event["notified"] - event["committed"])
                    parts["notify_to_broker"].append(event["tapped"] - event["notified"])
                    parts["broker_to_handler"].append(start - event["tapped"])
                    if _relay_was_waiting(event, in_flight[producer]):
                        parts["total_while_relay_awaited_confirm"].append(start - event["committed"])
        return {name: latency.summary(latency.ms(values)) for name, values in parts.items()}

    projection_kinds = [(f"{stage}.{fact}", stage, "api") for stage in STAGES for fact in ("started", "completed")]
    result: dict[str, Any] = {
        "pipelines": len(records),
        "handoff_stages": hops(handoffs.CHAIN[:3]),
        "handoff_per_hop": {kind: hops([(kind, p, c)]) for kind, p, c in handoffs.CHAIN},
        "handoff_to_projection": hops(projection_kinds),
        "observed": {
            "pipelines": len(observed),
            "handoff_stages": hops(handoffs.CHAIN[:3], observed_ids),
            "handoff_per_hop": {kind: hops([(kind, p, c)], observed_ids) for kind, p, c in handoffs.CHAIN},
            "handoff_to_projection": hops(projection_kinds, observed_ids),
        },
    }
    # End to end, from the api database's projection and from the client's event stream.
    streamed = [r.streamed - r.posted for r in records if r.streamed is not None]
    result["e2e_projection_ms"] = end_to_end(urls["api"], ids)
    result["e2e_client_ms"] = latency.summary(latency.ms(streamed))
    # Inside each stage, from the handler's transaction (jobs.created_at): the attempt claimed, the `started`
    # event committed (the end of that transaction, unless the claim came later), the outcome's recording
    # begun (attempts.finished_at, now() of the recording transaction), the `completed` event committed.
    inside: dict[str, Any] = {}
    for stage in STAGES:
        jobs = _rows(
            urls[stage],
            "SELECT j.pipeline_id, j.created_at, a.started_at, a.finished_at FROM jobs j"
            " JOIN attempts a ON a.job_id = j.id AND a.number = 1",
        )
        committed = {
            fact: {
                e["pipeline_id"]: e["committed"]
                for e in events.values()
                if e["service"] == stage and e["type"] == f"{stage}.{fact}" and e["committed"] is not None
            }
            for fact in ("started", "completed")
        }
        steps: dict[str, list[float]] = {"claim": [], "started": [], "recording": [], "completed": []}
        for job in jobs:
            pipeline = job["pipeline_id"]
            if pipeline not in ids or pipeline not in committed["completed"] or pipeline not in committed["started"]:
                continue
            begun = job["created_at"].timestamp()
            steps["claim"].append(job["started_at"].timestamp() - begun)
            steps["started"].append(committed["started"][pipeline] - begun)
            steps["recording"].append(job["finished_at"].timestamp() - begun)
            steps["completed"].append(committed["completed"][pipeline] - begun)
        inside[stage] = {
            "handler_to_claim_ms": latency.summary(latency.ms(steps["claim"])),
            "handler_to_started_commit_ms": latency.summary(latency.ms(steps["started"])),
            "handler_to_recording_ms": latency.summary(latency.ms(steps["recording"])),
            "handler_to_completed_commit_ms": latency.summary(latency.ms(steps["completed"])),
        }
    result["inside_stage"] = inside
    result["notify_paired"] = bool(notified)
    return result


def end_to_end(api_url: str, ids: set[str]) -> latency.Summary:
    """`pipelines.finished_at - created_at` of these pipelines in the gateway's database.

    From the transaction that accepted the POST to the projection's that recorded the pipeline's end.
    """
    with psycopg.connect(scratch.dsn(api_url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT created_at, finished_at FROM pipelines WHERE id = ANY(%s::uuid[]) AND finished_at IS NOT NULL",
            (list(ids),),
        ).fetchall()
    return latency.summary(latency.ms([finished.timestamp() - created.timestamp() for created, finished in rows]))


def _relay_was_waiting(event: dict[str, Any], in_flight: list[tuple[str, float, float]]) -> bool:
    """Whether the row's NOTIFY came while the relay awaited the confirm of an earlier row of its database."""
    return any(
        other != event["event_id"] and tapped < event["notified"] < confirmed for other, tapped, confirmed in in_flight
    )
