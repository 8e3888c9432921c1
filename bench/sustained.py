"""F. A long run at a steady rate: does the latency stay flat (no slow leak, no growing backlog)?

`python -m bench.sustained --minutes 10 --rate R` (`make bench` runs it as its part F): the benchmark's
installation (instant providers), and briefs POSTed at a fixed rate, open loop (each on its
schedule whatever the earlier ones do, at most `--concurrency` requests in flight), for the
given minutes; then it waits for the last pipelines. Without `--rate`, a short throughput
run measures the maximum first and half of it is used. Each pipeline's latency is its
`finished_at - created_at` in the gateway's database; the report gives p50 and p99 per
minute of submission and whether every minute's p99 stayed within 1.5x of the first
minute's, beside what the servers did in each minute (`Servers`: PostgreSQL's checkpoints, the
full-page images that follow one in the WAL, autovacuum runs on the installation's tables, the
machine's load, how its CPUs spent the minute, the CPU each process of the installation used) and
where the slowest pipelines of each minute spent their time (`tail_parts`), to tell a slow minute's
cause. Results go to var/bench/sustained.json; `make bench`
puts its own run's into the benchmark report (bench.report).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from castad_contracts.events import STAGE_ORDER
from castad_testkit import latency, scratch

from bench import castad_bench, cpu

FLAT_WITHIN = 1.5
OUT = scratch.REPO_ROOT / "var" / "bench" / "sustained.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sustained", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, help="pipelines per second (default: half the measured maximum)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight at most")
    return parser.parse_args(argv)


# The columns of /proc/stat's `cpu` line, in clock ticks: user nice system idle iowait irq softirq steal.
CPU_STATES = {"busy": (0, 1, 2, 5, 6), "iowait": (4,), "steal": (7,)}


def machine_ticks() -> list[int]:
    with open("/proc/stat") as stat:
        return [int(value) for value in stat.readline().split()[1:9]]


class Sample:
    def __init__(
        self, checkpoints: int, fpi: int, wal_bytes: int, vacuums: int, processes: dict[str, cpu.Snapshot]
    ) -> None:
        self.at = time.time()
        self.checkpoints, self.fpi, self.wal_bytes, self.vacuums = checkpoints, fpi, wal_bytes, vacuums
        self.processes = processes
        self.ticks = machine_ticks()
        self.load = os.getloadavg()[0]


class Servers(threading.Thread):
    """Samples, every `every_s`, counters of the PostgreSQL server, the machine and some processes.

    The PostgreSQL counters are cluster-wide (checkpoints finished, WAL full-page images and bytes) and per
    database of the installation (autovacuum and autoanalyze runs); the machine's are its CPU ticks and load
    average; and the CPU seconds of the processes `processes` names. `by_minute` gives what each minute since
    `started` added.
    """

    CLUSTER = """
    SELECT (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter),
           wal_fpi, wal_bytes::bigint FROM pg_stat_wal
    """
    TABLES = "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0)::bigint FROM pg_stat_user_tables"

    def __init__(
        self,
        urls: list[str],
        started: float,
        processes: Callable[[], dict[str, cpu.Snapshot]],
        every_s: float = 5.0,
    ) -> None:
        super().__init__(name="servers", daemon=True)
        self.connections = [psycopg.connect(scratch.dsn(url), autocommit=True) for url in urls]
        self.started = started
        self.processes = processes
        self.every_s = every_s
        self.samples: list[Sample] = []
        self.stopping = threading.Event()

    def sample(self) -> None:
        # Statistics are read once per transaction (stats_fetch_consistency): each query on its own here.
        row = self.connections[0].execute(self.CLUSTER).fetchone()
        assert row is not None
        checkpoints, fpi, wal_bytes = row
        vacuums = sum(conn.execute(self.TABLES).fetchone()[0] for conn in self.connections)  # type: ignore[index]
        self.samples.append(Sample(checkpoints, fpi, wal_bytes, vacuums, self.processes()))

    def run(self) -> None:
        self.sample()
        while not self.stopping.wait(self.every_s):
            self.sample()

    def stop(self) -> None:
        self.stopping.set()
        self.join(self.every_s + 5)
        self.sample()
        for conn in self.connections:
            conn.close()

    def by_minute(self) -> dict[int, dict[str, Any]]:
        """Per minute: checkpoints finished, full-page images, WAL MB and autovacuum runs it added.

        The highest one-minute load average seen in it; the share of the machine's CPU time that was busy, waiting
        for I/O or stolen by the hypervisor; and the CPU seconds each process used.
        """
        minutes: dict[int, dict[str, Any]] = {}
        ticks: dict[int, list[int]] = {}
        for before, after in zip(self.samples, self.samples[1:], strict=False):
            minute = int((after.at - self.started) // 60)
            if minute < 0:
                continue
            into = minutes.setdefault(
                minute,
                {"checkpoints": 0, "full_page_images": 0, "wal_mb": 0.0, "autovacuums": 0, "load": 0.0, "cpu_s": {}},
            )
            into["checkpoints"] += after.checkpoints - before.checkpoints
            into["full_page_images"] += after.fpi - before.fpi
            into["wal_mb"] += (after.wal_bytes - before.wal_bytes) / 1e6
            into["autovacuums"] += after.vacuums - before.vacuums
            into["load"] = max(into["load"], after.load)
            for name, snapshot in after.processes.items():
                into["cpu_s"][name] = into["cpu_s"].get(name, 0.0) + cpu.used(before.processes.get(name, {}), snapshot)
            spent = [now - then for now, then in zip(after.ticks, before.ticks, strict=True)]
            ticks[minute] = [sum(pair) for pair in zip(ticks.get(minute, [0] * len(spent)), spent, strict=True)]
        for minute, spent in ticks.items():
            total = sum(spent) or 1
            for state, columns in CPU_STATES.items():
                minutes[minute][state] = sum(spent[column] for column in columns) / total
        return minutes


# A pipeline's moments in order: created, then each stage's start and finish (of its latest attempt, by the
# stage's clock, as its events said), then finished in the gateway.
TIMES = (
    "SELECT p.created_at, "
    + ", ".join(f"{stage}.started_at, {stage}.finished_at" for stage in STAGE_ORDER)
    + ", p.finished_at FROM pipelines p "
    + " ".join(
        f"JOIN pipeline_stages {stage} ON {stage}.pipeline_id = p.id AND {stage}.stage = '{stage}'"
        for stage in STAGE_ORDER
    )
    + " WHERE p.id = ANY(%s::uuid[])"
)
PARTS = [part for stage in STAGE_ORDER for part in (f"to {stage}", str(stage))] + ["to finished"]


def tail_parts(pipelines: list[list[float]]) -> dict[str, float]:
    """Where the pipelines at or above the p99 of these spent their time.

    The mean, in ms, of each part between two of their moments (a wait before a stage starts, the stage itself, the
    gateway's last step).
    """
    totals = [moments[-1] - moments[0] for moments in pipelines]
    p99 = latency.percentile(totals, 99)
    slowest = [moments for moments, total in zip(pipelines, totals, strict=True) if total >= p99]
    return {
        part: 1000 * sum(moments[index + 1] - moments[index] for moments in slowest) / max(len(slowest), 1)
        for index, part in enumerate(PARTS)
    }


def run(bench: castad_bench.CastadBench, minutes: float, rate: float, concurrency: int) -> dict[str, Any]:
    count = int(minutes * 60 * rate)
    started = time.time()
    servers = Servers(list(bench.urls.values()), started, bench.cpu_snapshot)
    servers.start()
    try:
        result = _submit(bench, count, rate, concurrency, started)
    finally:
        servers.stop()
    result["servers"] = servers.by_minute()
    return result


def _submit(
    bench: castad_bench.CastadBench, count: int, rate: float, concurrency: int, started: float
) -> dict[str, Any]:
    late = 0
    with concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="submit") as pool:
        futures = []
        for number in range(count):
            due = started + number / rate
            pause = due - time.time()
            if pause > 0:
                time.sleep(pause)
            elif pause < -1:
                late += 1
            futures.append(pool.submit(bench.submit, 1000 + number))
        records = [future.result() for future in futures]
    ids = [record.pipeline_id for record in records]
    bench.wait_all(ids, timeout_s=600)
    with psycopg.connect(scratch.dsn(bench.urls["api"]), autocommit=True) as conn:
        rows = conn.execute(TIMES, (ids,)).fetchall()
    latencies: dict[int, list[float]] = {}
    timed: dict[int, list[list[float]]] = {}  # the moments of each pipeline that has all of them
    for created, *times in rows:
        minute = int((created.timestamp() - started) // 60)
        latencies.setdefault(minute, []).append(times[-1].timestamp() - created.timestamp())
        timed.setdefault(minute, [])
        if None not in times:
            timed[minute].append([moment.timestamp() for moment in (created, *times)])
    minutes_summary = {minute: latency.summary(latency.ms(values)) for minute, values in sorted(latencies.items())}
    first_p99 = minutes_summary[0]["p99"]
    worst = max(summary["p99"] for summary in minutes_summary.values())
    return {
        "rate": rate,
        "pipelines": count,
        "submitted_late": late,
        "minutes": minutes_summary,
        "tail_parts": {  # untimed: pipelines left out, a stage's row lacking its start or end
            minute: tail_parts(pipelines) | {"untimed": len(latencies[minute]) - len(pipelines)}
            for minute, pipelines in sorted(timed.items())
        },
        "first_minute_p99_ms": first_p99,
        "worst_minute_p99_ms": worst,
        "flat": worst <= FLAT_WITHIN * first_p99,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    workdir = (scratch.REPO_ROOT / "var" / "bench" / scratch.RUN_ID).resolve()
    cleanup = scratch.Cleanup()
    try:
        with scratch.interrupt_on_sigterm():
            bench = castad_bench.CastadBench(cleanup, workdir)
            bench.setup()
            bench.start()
            bench.sequential(5, first=0)
            rate = args.rate
            maximum = None
            if rate is None:
                maximum = bench.throughput(300, 8, first=10, count_commits=False)["rate"]
                rate = maximum / 2
            result = run(bench, args.minutes, rate, args.concurrency)
            result["measured_maximum"] = maximum
    finally:
        cleanup.run()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    for minute, summary in result["minutes"].items():
        print(f"minute {minute}: n={summary['n']} p50={summary['p50']:.0f} ms p99={summary['p99']:.0f} ms")
    print(f"flat within {FLAT_WITHIN}x of the first minute: {result['flat']} ({OUT})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
