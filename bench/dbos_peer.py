"""D. Driving the durable peer: the same three steps as one DBOS workflow (bench/dbos_app.py).

The peer runs in a process of its own on a database of this run (`castad_bench_<run>_dbos`,
DBOS's system database: its workflow and step checkpoints), as Castad runs on its own. The
client drives it as it drives Castad: briefs POSTed over HTTP with an Idempotency-Key,
at most `concurrency` in flight, until the database shows every workflow SUCCESS; one at a
time for latencies, the client waiting for each workflow's result.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import httpx
import psycopg
from castad_local import stack as stack_
from castad_runtime import migrations
from castad_testkit import latency, scratch

from bench import castad_bench, commits, cpu


class DbosPeer:
    def __init__(self, cleanup: scratch.Cleanup, workdir: pathlib.Path) -> None:
        self.cleanup = cleanup
        self.database = f"castad_bench_{scratch.RUN_ID}_dbos"
        self.url = scratch.database_url(self.database)
        self.artifacts_dir = workdir / "dbos-artifacts"
        self.log = workdir / "logs" / "dbos.log"
        self.port = stack_.free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self._local = threading.local()
        self._clients: list[httpx.Client] = []

    def start(self) -> None:
        self.cleanup.push(f"drop {self.database}", lambda: migrations.drop_database(self.url))
        self.cleanup.push("remove dbos artifacts", lambda: shutil.rmtree(self.artifacts_dir, ignore_errors=True))
        migrations.ensure_database(self.url)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PYTHONPATH": str(scratch.REPO_ROOT),
            # DBOS parses a URL (not a libpq key=value string such as scratch.dsn makes), with its own driver.
            "BENCH_DBOS_DATABASE_URL": self.url.replace("postgresql+psycopg://", "postgresql://", 1),
            "BENCH_DBOS_PORT": str(self.port),
            "BENCH_DBOS_ARTIFACTS": str(self.artifacts_dir),
            "OTEL_SDK_DISABLED": "true",
        }
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.dbos_app"],
                cwd=scratch.REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.cleanup.push("stop the dbos peer", self.stop)
        self.cleanup.push("close dbos clients", self._close_clients)
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{self.base_url}/docs", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the DBOS peer did not start; log in {self.log}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stack_.stop_group(process)

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = httpx.Client(base_url=self.base_url, timeout=60)
            self._local.client = client
            self._clients.append(client)
        return client

    def _close_clients(self) -> None:
        for client in self._clients:
            client.close()

    def submit(self, number: int) -> castad_bench.Record:
        body = castad_bench.bench_brief(number).model_dump_json()
        key = str(uuid.uuid4())
        headers = {"Content-Type": "application/json", "Idempotency-Key": key}
        posted = time.time()
        response = self._client().post("/v1/pipelines", content=body, headers=headers)
        if response.status_code != 202:
            raise RuntimeError(f"the DBOS peer answered {response.status_code}: {response.text[:300]}")
        return castad_bench.Record(key, posted)

    def _rows(self, ids: list[str]) -> list[tuple[str, str, int, int]]:
        with psycopg.connect(scratch.dsn(self.url), autocommit=True) as conn:
            return conn.execute(
                "SELECT workflow_uuid, status, created_at, updated_at FROM dbos.workflow_status"
                " WHERE workflow_uuid = ANY(%s)",
                (ids,),
            ).fetchall()

    def wait_all(self, ids: list[str], timeout_s: float) -> list[tuple[str, str, int, int]]:
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self._rows(ids)
            failed = [row for row in rows if row[1] not in ("SUCCESS", "PENDING", "ENQUEUED")]
            if failed:
                raise RuntimeError(f"{len(failed)} DBOS workflows ended {failed[0][1]}; log in {self.log}")
            if sum(row[1] == "SUCCESS" for row in rows) == len(ids):
                return rows
            if time.monotonic() > deadline:
                raise TimeoutError(f"DBOS workflows unfinished after {timeout_s} s; log in {self.log}")
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"the DBOS peer exited; log in {self.log}")
            time.sleep(0.05)

    def sequential(self, count: int, first: int, pause_s: float = 0.02) -> list[castad_bench.Record]:
        """One workflow at a time: submit, wait for its result, pause, next."""
        records = []
        for number in range(first, first + count):
            record = self.submit(number)
            self._client().get(f"/v1/pipelines/{record.pipeline_id}/result").raise_for_status()
            record.streamed = time.time()
            records.append(record)
            time.sleep(pause_s)
        return records

    def _end_to_end(self, records: list[castad_bench.Record]) -> latency.Summary:
        """`updated_at - created_at` of the workflows' status rows (ms, as DBOS stores them)."""
        rows = self._rows([record.pipeline_id for record in records])
        return latency.summary([float(updated - created) for _, _, created, updated in rows])

    def idle(self, count: int, warmup: int) -> dict[str, Any]:
        self.sequential(warmup, first=0)
        records = self.sequential(count, first=warmup)
        return {
            "pipelines": count,
            "e2e_database_ms": self._end_to_end(records),
            "e2e_client_ms": latency.summary(latency.ms([r.streamed - r.posted for r in records if r.streamed])),
        }

    def idle_lot(self, count: int, first: int) -> latency.Summary:
        """End to end of `count` workflows run one at a time, from the database."""
        return self._end_to_end(self.sequential(count, first))

    def throughput(
        self, count: int, concurrency: int, first: int, timeout_s: float = 300, count_commits: bool = True
    ) -> dict[str, Any]:
        counter = commits.Counter([self.database]) if count_commits else None
        if counter is not None:
            counter.start()
        before = self.cpu_snapshot()
        started = time.time()
        with concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="submit") as pool:
            records = list(pool.map(self.submit, range(first, first + count)))
        submitted = time.time()
        rows = self.wait_all([record.pipeline_id for record in records], timeout_s)
        after = self.cpu_snapshot()
        per_pipeline = counter.stop(count)[self.database] if counter is not None else None
        seconds = max(updated for _, _, _, updated in rows) / 1000 - started
        return {
            "pipelines": count,
            "concurrency": concurrency,
            "seconds": seconds,
            "rate": count / seconds,
            "submit_seconds": submitted - started,
            "latency_ms": latency.summary([float(updated - created) for _, _, created, updated in rows]),
            "cpu_ms_per_pipeline": {name: cpu.used(before[name], after[name]) * 1000 / count for name in before},
            "commits_per_pipeline": per_pipeline,
        }

    def cpu_snapshot(self) -> dict[str, cpu.Snapshot]:
        assert self.process is not None
        return {
            "dbos": cpu.snapshot(cpu.in_group(self.process.pid)),
            "postgres": cpu.snapshot(cpu.postgres_backends(self.database)),
            "client": cpu.snapshot(lambda pid, pgrp, cmdline: pid == os.getpid()),
        }
