"""F. A long run at a steady rate: does the latency stay flat (no slow leak, no growing backlog)?

`python -m bench.sustained --minutes 10 --rate R` (`make bench` runs it as its part F): the benchmark's
installation (instant providers), and briefs POSTed at a fixed rate, open loop (each on its
schedule whatever the earlier ones do, at most `--concurrency` requests in flight), for the
given minutes; then it waits for the last pipelines. Without `--rate`, a short throughput
run measures the maximum first and half of it is used. Each pipeline's latency is its
`finished_at - created_at` in the gateway's database; the report gives p50 and p99 per
minute of submission and whether every minute's p99 stayed within 1.5x of the first
minute's. Results go to var/bench/sustained.json; `make bench` puts its own run's into
BENCHMARKS.md (bench.report).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from typing import Any

import psycopg

from bench import castad_bench, common, latency

FLAT_WITHIN = 1.5
OUT = common.REPO_ROOT / "var" / "bench" / "sustained.json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sustained", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, help="pipelines per second (default: half the measured maximum)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight at most")
    return parser.parse_args(argv)


def run(bench: castad_bench.CastadBench, minutes: float, rate: float, concurrency: int) -> dict[str, Any]:
    count = int(minutes * 60 * rate)
    started = time.time()
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
    with psycopg.connect(common.dsn(bench.urls["api"]), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT created_at, finished_at FROM pipelines WHERE id = ANY(%s::uuid[])", (ids,)
        ).fetchall()
    by_minute: dict[int, list[float]] = {}
    for created, finished in rows:
        minute = int((created.timestamp() - started) // 60)
        by_minute.setdefault(minute, []).append(finished.timestamp() - created.timestamp())
    minutes_summary = {minute: latency.summary(latency.ms(values)) for minute, values in sorted(by_minute.items())}
    first_p99 = minutes_summary[0]["p99"]
    worst = max(summary["p99"] for summary in minutes_summary.values())
    return {
        "rate": rate,
        "pipelines": count,
        "submitted_late": late,
        "minutes": minutes_summary,
        "first_minute_p99_ms": first_p99,
        "worst_minute_p99_ms": worst,
        "flat": worst <= FLAT_WITHIN * first_p99,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    workdir = (common.REPO_ROOT / "var" / "bench" / common.RUN_ID).resolve()
    cleanup = common.Cleanup()
    try:
        with common.interrupt_on_sigterm():
            bench = castad_bench.CastadBench(cleanup, workdir)
            bench.setup()
            bench.start()
            bench.sequential(5, first=0)
            rate = args.rate
            maximum = None
            if rate is None:
                maximum = bench.throughput(300, 8, first=10)["rate"]
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
