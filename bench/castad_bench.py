"""A. Castad end to end with instant providers, every service its own process.

One isolated installation per run, like the tests': a database per service
(`castad_bench_<run>_<service>`, migrated by castad_runtime.migrations through
castad_local.stack.prepare), its own RabbitMQ namespace (`bench-<run>`), its own artifacts
directory, and api, relay, lyric, song and video started from infra/local/Procfile by
castad_local.stack.Stack with `CASTAD_<STAGE>_PROVIDER=instant`. Everything else keeps its
documented default.

The idle run's observers and what they time: `bench.handoff_parts`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
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
import psycopg
from castad_api import keys
from castad_contracts import api, brief, events, topology
from castad_local import access
from castad_local import stack as stack_
from castad_runtime import messaging, migrations
from castad_testkit import briefs, handoffs, latency, scratch

from bench import commits, cpu, handoff_parts

SERVICES = topology.WITH_DATABASE
STAGES = tuple(stage.value for stage in events.STAGE_ORDER)


@dataclasses.dataclass
class Record:
    pipeline_id: str
    posted: float  # client clock when the POST was sent
    streamed: float | None = None  # client clock when the terminal event arrived on the SSE stream


def bench_brief(number: int) -> brief.Brief:
    """Return the brief every benchmark sends as its `number`th: an English jazz song for a cafe in Busan, 3 s."""
    return briefs.sample(
        f"Bench Cafe {number}",
        region="Busan",
        detail_region_info="a small cafe by the sea",
        language=brief.Language.ENGLISH,
        genre="jazz",
    )


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
        return bench_brief(number)

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
        last = max(handoff_parts.epoch(finished) or 0.0 for _, _, finished in rows)
        latencies = [
            (handoff_parts.epoch(finished) or 0.0) - (handoff_parts.epoch(created) or 0.0)
            for _, created, finished in rows
        ]
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
                latency.ms([(handoff_parts.epoch(finished) or 0.0) - videos_done[pid] for pid, _, finished in rows])
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
        return handoff_parts.end_to_end(self.urls["api"], {record.pipeline_id for record in records})

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
            tap = handoff_parts.Tap(self.topology.exchange)
            observers.append(tap)
            clocks = {svc: handoff_parts.NotifyClock(url) for svc, url in self.urls.items()}
            observers.extend(clocks.values())
            for observer in observers:
                observer.start()
            observed = self.sequential(count, first=warmup + count)
        finally:
            for observer in observers:
                observer.stop()
            self.commit_clock(False)
        arrivals = {svc: clock.arrivals for svc, clock in clocks.items()}
        streamed = [record.streamed - record.posted for record in records if record.streamed is not None]
        return handoff_parts.analyse_idle(
            self.urls,
            [record.pipeline_id for record in records],
            [record.pipeline_id for record in observed],
            streamed,
            tap.seen,
            arrivals,
        )
