"""`make bench`: run every part side by side, then rewrite docs/reports/benchmarks.md.

A: Castad; B: a plain Dramatiq pipeline; C: NOTIFY inside or after the commit; D: the same
steps as a DBOS workflow, measured in rounds alternating with A's (bench.paired); E: an outbox
backlog drained by the relay against a raw publisher; F: a long run at half of A's throughput;
G: two replicas of every worker beside one (bench.replicas), checked for anything lost or reordered.

Everything runs against the local servers (127.0.0.1) in databases, queues and processes
of this run only, removed at the end however the run ends (Ctrl-C and SIGTERM included).
Logs of the services stay in var/bench/<run id>/logs only if the run failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shutil
import sys
import time
from typing import Any

from castad_testkit import machine, scratch

from bench import castad_bench, dbos_peer, drain, notify, paired, peer, replicas, report, sustained

PARTS = ("castad", "dbos", "peer", "drain", "sustained", "notify", "replicas")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--pipelines", type=int, default=200, help="pipelines of each throughput run")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight while submitting to Castad")
    parser.add_argument(
        "--peer-sustained", type=int, default=2000, help="pipelines of a longer throughput run of the plain pipeline"
    )
    parser.add_argument("--idle", type=int, default=50, help="pipelines run one at a time for latencies")
    parser.add_argument("--rounds", type=int, default=5, help="paired rounds of Castad and DBOS (odd)")
    parser.add_argument(
        "--idle-lot", type=int, default=15, help="pipelines run one at a time in each paired round, per side"
    )
    parser.add_argument("--warmup", type=int, default=5, help="pipelines run before measuring")
    parser.add_argument("--notify-threads", type=int, default=8)
    parser.add_argument("--notify-per-thread", type=int, default=1000, help="transactions per writer and round")
    parser.add_argument("--notify-rounds", type=int, default=2)
    parser.add_argument("--backlog", type=int, default=100_000, help="outbox rows of the drain part")
    parser.add_argument("--backlog-per-pipeline", type=int, default=10, help="events per pipeline in the backlog")
    parser.add_argument(
        "--drain-rounds", type=int, default=3, help="rounds of the relay's drain and the raw publish (odd)"
    )
    parser.add_argument("--raw-window", type=int, default=1000, help="unconfirmed publishes at a time, raw peer")
    parser.add_argument("--sustained-minutes", type=float, default=10.0, help="length of the steady run")
    parser.add_argument(
        "--replica-rounds", type=int, default=2, help="pairs of rounds, two replicas of every worker and one"
    )
    parser.add_argument("--only", choices=PARTS, action="append", help="run only these parts")
    parser.add_argument(
        "--output",
        type=pathlib.Path,
        default=report.OUTPUT,
        help="the report; its measurements and charts go beside it",
    )
    parser.add_argument("--json", type=pathlib.Path, default=scratch.REPO_ROOT / "var" / "bench" / "last-run.json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.rounds % 2 == 0 or args.drain_rounds < 1 or args.drain_rounds % 2 == 0:
        parser.error("--rounds and --drain-rounds must be odd (the report shows the median round)")
    if args.idle_lot < 1 or args.replica_rounds < 1:
        parser.error("--idle-lot and --replica-rounds must be at least 1")
    return args


def _phase(results: dict[str, Any], name: str) -> None:
    results.setdefault("load", {})[name] = machine.load()
    scratch.log.info("%s (load average %.2f %.2f %.2f)", name, *machine.load())


def run_durable(args: argparse.Namespace, cleanup: scratch.Cleanup, workdir: pathlib.Path, parts: list[str]) -> Any:
    """A and D, both up at once.

    The detailed idle run of each, a throughput run of each that counts its commits (and warms it up under load),
    then `--rounds` paired rounds (bench.paired). The throughput shown in detail is that of the median round, with
    the commits of the counting run.
    """
    results: dict[str, dict[str, Any]] = {}
    with cleanup.scope():
        sides: dict[str, paired.Side] = {}
        if "castad" in parts:
            bench = castad_bench.CastadBench(cleanup, workdir)
            bench.setup()
            bench.start()
            sides["castad"] = bench
            results["castad"] = {
                "env": {key: value for key, value in bench.env().items() if not key.endswith(("_URL", "_SOURCES"))}
            }
        if "dbos" in parts:
            driver = dbos_peer.DbosPeer(cleanup, workdir)
            driver.start()
            sides["dbos"] = driver
            results["dbos"] = {}
        for name, side in sides.items():
            results[name]["idle"] = side.idle(args.idle, warmup=args.warmup)
        first = args.warmup + 2 * args.idle  # Castad's idle run took twice `--idle`: a lot unobserved, one observed
        for name, side in sides.items():
            results[name]["commits_run"] = side.throughput(args.pipelines, args.concurrency, first, count_commits=True)
        first += args.pipelines
        rounds = paired.run(sides, args.rounds, args.pipelines, args.concurrency, args.idle_lot, first)
    shown = paired.median_round(rounds)
    for name in sides:
        commits = results[name]["commits_run"]["commits_per_pipeline"]
        results[name]["throughput"] = {**shown[name]["throughput"], "commits_per_pipeline": commits}
    results["paired"] = {"rounds": rounds, "idle_lot": args.idle_lot}
    return results


def run_sustained(args: argparse.Namespace, cleanup: scratch.Cleanup, workdir: pathlib.Path, rate: float) -> Any:
    with cleanup.scope():
        bench = castad_bench.CastadBench(cleanup, workdir)
        bench.setup()
        bench.start()
        bench.sequential(args.warmup, first=0)
        return sustained.run(bench, args.sustained_minutes, rate, concurrency=2 * args.concurrency)


def run_peer(args: argparse.Namespace, cleanup: scratch.Cleanup, workdir: pathlib.Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    processes, threads = os.cpu_count() or 1, 8
    for name, confirm in (("defaults", False), ("confirms", True)):
        with cleanup.scope():
            driver = peer.Peer(cleanup, workdir, confirm)
            driver.start(processes, threads)
            idle = driver.idle(args.idle, warmup=args.warmup)
            throughput = driver.throughput(args.pipelines)
            results[name] = {"idle": idle, "throughput": throughput, "processes": processes, "threads": threads}
            if name == "defaults" and args.peer_sustained:
                results[name]["sustained"] = driver.throughput(args.peer_sustained)
    return results


def run_notify(args: argparse.Namespace, cleanup: scratch.Cleanup, workdir: pathlib.Path) -> dict[str, Any]:
    python = notify.run(args.notify_threads, args.notify_per_thread, args.notify_rounds, cleanup)
    pgbench = notify.run_pgbench(str(workdir), args.notify_threads, args.notify_per_thread, args.notify_rounds, cleanup)
    return {"python": python, "pgbench": pgbench}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    scratch.log.setLevel(logging.INFO)
    parts = args.only or list(PARTS)
    workdir = (scratch.REPO_ROOT / "var" / "bench" / scratch.RUN_ID).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    cleanup = scratch.Cleanup()
    results: dict[str, Any] = {"run_id": scratch.RUN_ID, "args": {k: str(v) for k, v in vars(args).items()}}
    started = time.monotonic()
    ok = False
    try:
        with scratch.interrupt_on_sigterm():
            results["facts"] = machine.facts()
            _phase(results, "start")
            if {"castad", "dbos"} & set(parts):
                results.update(run_durable(args, cleanup, workdir, parts))
                _phase(results, f"after {' and '.join(part for part in ('castad', 'dbos') if part in parts)}")
            if "peer" in parts:
                results["peer"] = run_peer(args, cleanup, workdir)
                _phase(results, "after peer")
            if "drain" in parts:
                results["drain"] = drain.run(
                    cleanup, workdir, args.backlog, args.backlog_per_pipeline, args.raw_window, args.drain_rounds
                )
                _phase(results, "after drain")
            if "sustained" in parts and "castad" in results:
                rate = results["castad"]["throughput"]["rate"] / 2
                results["sustained"] = run_sustained(args, cleanup, workdir, rate)
                _phase(results, "after sustained")
            if "notify" in parts:
                results["notify"] = run_notify(args, cleanup, workdir)
                _phase(results, "after notify")
            if "replicas" in parts:
                results["replicas"] = replicas.run(
                    cleanup, workdir, args.pipelines, args.concurrency, args.replica_rounds, args.warmup
                )
                _phase(results, "after replicas")
                if results["replicas"]["findings"]:
                    raise RuntimeError(f"replicas: {len(results['replicas']['findings'])} findings")
        ok = True
    except KeyboardInterrupt:
        scratch.log.error("interrupted; cleaning up")
    finally:
        cleanup.run()
        results["seconds"] = time.monotonic() - started
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str))
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            scratch.log.error("logs kept in %s; raw results in %s", workdir, args.json)
    if not ok:
        return 1
    if set(parts) == set(PARTS):
        # the measurements kept beside the report, and the report written from what was kept, so that
        # `python -m bench.report` writes the same page again
        kept = json.dumps(results, indent=1, default=str) + "\n"
        args.output.with_suffix(".json").write_text(kept)
        report.write(json.loads(kept), args.output)
        scratch.log.info("wrote %s and its charts in %.0f s", args.output, results["seconds"])
    else:
        scratch.log.info("partial run (%s): %s not rewritten; raw results in %s", parts, args.output.name, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
