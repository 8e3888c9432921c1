"""B. The peer: three no-op Dramatiq actors chained, step1 -> step2 -> step3.

This module is what the `dramatiq` command line loads in its worker processes
(`python -m dramatiq bench.peer_actors`). Each actor notes when it started and when it
sent the next message (time.time(), the same host clock as everything else); step3
appends the pipeline's timestamps as one JSON line to BENCH_PEER_RESULTS.

Environment: BENCH_PEER_PREFIX (queue names `<prefix>.step1..3`), BENCH_PEER_RESULTS,
BENCH_PEER_CONFIRM=1 for publisher confirms (Dramatiq's default is without),
CASTAD_AMQP_URL.
"""

from __future__ import annotations

import json
import os
import time

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

PREFIX = os.environ.get("BENCH_PEER_PREFIX", "bench-peer")
RESULTS = os.environ.get("BENCH_PEER_RESULTS", os.devnull)
CONFIRM = os.environ.get("BENCH_PEER_CONFIRM", "0") == "1"
AMQP_URL = os.environ.get("CASTAD_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
QUEUES = tuple(f"{PREFIX}.step{number}" for number in (1, 2, 3))

broker = RabbitmqBroker(url=AMQP_URL, confirm_delivery=CONFIRM)
dramatiq.set_broker(broker)

_results: dict[int, int] = {}  # pid -> file descriptor (worker processes are forked)


def _write(line: str) -> None:
    fd = _results.get(os.getpid())
    if fd is None:
        fd = _results[os.getpid()] = os.open(RESULTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())  # one write per line: whole lines even with several processes


@dramatiq.actor(queue_name=QUEUES[0])
def step1(pipeline_id: str, sent0: float) -> None:
    started1 = time.time()
    step2.send(pipeline_id, sent0, started1, time.time())


@dramatiq.actor(queue_name=QUEUES[1])
def step2(pipeline_id: str, sent0: float, started1: float, sent1: float) -> None:
    started2 = time.time()
    step3.send(pipeline_id, sent0, started1, sent1, started2, time.time())


@dramatiq.actor(queue_name=QUEUES[2])
def step3(pipeline_id: str, sent0: float, started1: float, sent1: float, started2: float, sent2: float) -> None:
    started3 = time.time()
    _write(json.dumps([pipeline_id, sent0, started1, sent1, started2, sent2, started3]) + "\n")
