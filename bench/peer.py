"""B. Driving the plain Dramatiq pipeline: worker by the `dramatiq` command line, client here.

The worker is `python -m dramatiq bench.peer_actors --processes <cores> --threads 8`
(the command line's defaults, spelled out) in its own process group. The client
enqueues step1 messages with a RabbitmqBroker of its own, the same way an actor's
.send() does, and reads the results file step3 appends to.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import uuid
from typing import Any

import dramatiq
import pika
from castad_local import stack as stack_
from castad_testkit import latency, scratch
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench import cpu


class Peer:
    def __init__(self, cleanup: scratch.Cleanup, workdir: pathlib.Path, confirm: bool) -> None:
        self.cleanup = cleanup
        self.confirm = confirm
        self.prefix = f"bench-{scratch.RUN_ID}-peer{'-confirm' if confirm else ''}"
        self.queues = tuple(f"{self.prefix}.step{number}" for number in (1, 2, 3))
        self.results = workdir / f"{self.prefix}.jsonl"
        self.log = workdir / "logs" / f"{self.prefix}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.broker: RabbitmqBroker | None = None
        self._read = 0
        self.done: dict[str, list[float]] = {}

    def start(self, processes: int, threads: int) -> None:
        self.cleanup.push(f"delete {self.prefix} queues", self._delete_queues)
        self.broker = RabbitmqBroker(url=scratch.AMQP_URL, confirm_delivery=self.confirm)
        self.cleanup.push(f"close {self.prefix} client", self.broker.close)
        for queue in self.queues:
            self.broker.declare_queue(queue, ensure=True)
        self.results.touch()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PYTHONPATH": str(scratch.REPO_ROOT),
            "BENCH_PEER_PREFIX": self.prefix,
            "BENCH_PEER_RESULTS": str(self.results),
            "BENCH_PEER_CONFIRM": "1" if self.confirm else "0",
            "CASTAD_AMQP_URL": scratch.AMQP_URL,
        }
        command = [sys.executable, "-m", "dramatiq", "bench.peer_actors"]
        command += ["--processes", str(processes), "--threads", str(threads), "--queues", *self.queues]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=scratch.REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.cleanup.push(f"stop {self.prefix} worker", self.stop)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            stack_.stop_group(process)

    def _delete_queues(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(scratch.AMQP_URL))
        try:
            channel = connection.channel()
            for queue in self.queues:
                for suffix in ("", ".DQ", ".XQ"):
                    channel.queue_delete(queue + suffix)
        finally:
            connection.close()

    def send(self, pipeline_id: str) -> None:
        assert self.broker is not None
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=self.queues[0], actor_name="step1", args=(pipeline_id, time.time()), kwargs={}, options={}
        )
        self.broker.enqueue(message)

    def _collect(self) -> None:
        with self.results.open("rb") as results:
            results.seek(self._read)
            chunk = results.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._read += len(complete)
        for line in complete.splitlines():
            row = json.loads(line)
            self.done[row[0]] = row[1:]

    def wait(self, ids: list[str], timeout_s: float, poll_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self._collect()
            if all(pid in self.done for pid in ids):
                return
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"dramatiq worker exited; log in {self.log}")
            if time.monotonic() > deadline:
                missing = sum(pid not in self.done for pid in ids)
                raise TimeoutError(f"{missing} of {len(ids)} peer pipelines unfinished after {timeout_s} s")
            time.sleep(poll_s)

    def sequential(self, count: int, pause_s: float = 0.02, timeout_s: float = 60) -> list[str]:
        ids = []
        for _ in range(count):
            pipeline_id = str(uuid.uuid4())
            self.send(pipeline_id)
            self.wait([pipeline_id], timeout_s, poll_s=0.001)
            ids.append(pipeline_id)
            time.sleep(pause_s)
        return ids

    def idle(self, count: int, warmup: int) -> dict[str, Any]:
        self.sequential(warmup, timeout_s=120)  # the first one also waits for the worker to boot
        ids = self.sequential(count)
        rows = [self.done[pid] for pid in ids]
        # row: sent0, started1, sent1, started2, sent2, started3
        hops = {
            "client->step1": [r[1] - r[0] for r in rows],
            "step1->step2": [r[3] - r[2] for r in rows],
            "step2->step3": [r[5] - r[4] for r in rows],
        }
        every = [value for values in hops.values() for value in values]
        return {
            "pipelines": count,
            "handoff": latency.summary(latency.ms(every)),
            "handoff_per_hop": {name: latency.summary(latency.ms(values)) for name, values in hops.items()},
            "e2e_ms": latency.summary(latency.ms([r[5] - r[0] for r in rows])),
        }

    def throughput(self, count: int, timeout_s: float = 300) -> dict[str, Any]:
        ids = [str(uuid.uuid4()) for _ in range(count)]
        before = self.cpu_snapshot()
        started = time.time()
        for pipeline_id in ids:
            self.send(pipeline_id)
        submitted = time.time()
        self.wait(ids, timeout_s, poll_s=0.02)
        after = self.cpu_snapshot()
        rows = [self.done[pid] for pid in ids]
        seconds = max(r[5] for r in rows) - started
        return {
            "pipelines": count,
            "seconds": seconds,
            "rate": count / seconds,
            "submit_seconds": submitted - started,
            "latency_ms": latency.summary(latency.ms([r[5] - r[0] for r in rows])),
            "cpu_ms_per_pipeline": {name: cpu.used(before[name], after[name]) * 1000 / count for name in before},
        }

    def cpu_snapshot(self) -> dict[str, cpu.Snapshot]:
        assert self.process is not None
        return {
            "dramatiq worker": cpu.snapshot(cpu.in_group(self.process.pid)),
            "rabbitmq": cpu.snapshot(cpu.rabbitmq()),
            "client": cpu.snapshot(lambda pid, pgrp, cmdline: pid == os.getpid()),
        }
