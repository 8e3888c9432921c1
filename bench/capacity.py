"""`make bench-capacity`: what one pipeline costs each part of Castad, what each part's ceiling is on this
machine, and what a given rate would need (docs/reports/capacity.md, its measurements in capacity.json).

Three measurements, each on the harness's own installation (bench.castad_bench: own databases, namespace,
processes), then a model that multiplies them out:

1. **Orchestration**, with the instant providers: `--pipelines` pipelines at `--concurrency`, counting per
   pipeline the CPU of every process and of PostgreSQL's backends, the commits and the rows written in each
   database (`pg_stat_database`), the WAL each database wrote (`pg_walinspect`, by the database named in each
   record's blocks; records naming no relation, commits mostly, counted apart), and the events each outbox
   published with the deliveries the topology routes them to.
2. **Ceilings of the shared parts** measured here: PostgreSQL's commits a second at 32 writers (bench.notify,
   no wake-up) and one relay leader's drain of an outbox (bench.drain, one round).
3. **Jobs waiting at a provider**: `--waiting` songs left at the music API's fake (which never finishes them),
   each polled on the stage's schedule by its prober (castad_runtime.stage.probes, in batches); over
   `--window-s`, the polls the fake answered and the CPU the song service and its database's backends spent on
   them, the HTTP requests included.

The model (`model`) is arithmetic on those figures: every projected number is labelled so. Two cores cannot
show what more hardware does; the report says which part is measured and which is projected. Its words are
bench/templates/capacity.md.j2's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import os
import pathlib
import sys
import time
from typing import Any

import psycopg
from castad_contracts import topology
from castad_local.fakes import chat, creatomate, suno
from castad_runtime.stage import service as stage_service
from castad_testkit import machine, scratch

from bench import castad_bench, commits, cpu, drain, notify, pages, providers

TARGET_RATE = 5_000  # pipelines a second of orchestration the model is asked about (issue 37)
TARGET_WAITING = 1_000_000  # jobs waiting at providers at once
CORE_SHARE = 0.7  # a replica is planned at 70 % of a core busy, leaving room for bursts
DB_SHARE = 0.5  # a database server is planned at half its measured commit ceiling


# -- 1. orchestration ---------------------------------------------------------------------------


def _database_stats(names: list[str]) -> dict[str, dict[str, int]]:
    with psycopg.connect(scratch.admin_dsn(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname, oid, tup_inserted, tup_updated, tup_deleted FROM pg_stat_database d"
            " JOIN pg_database USING (datname) WHERE datname = ANY(%s)",
            (names,),
        ).fetchall()
    return {name: {"oid": oid, "rows": ins + upd + dele} for name, oid, ins, upd, dele in rows}


def _wal_lsn() -> str:
    with psycopg.connect(scratch.admin_dsn(), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_by_database(start: str, end: str, oids: dict[int, str]) -> dict[str, int]:
    """WAL bytes between two positions, by the database each record's first block belongs to.

    A block reference reads `rel <tablespace>/<database>/<relation>`; a record without one (a commit, a
    checkpoint) goes under "no relation"; databases not asked about under "other"."""
    totals: dict[str, int] = {name: 0 for name in oids.values()} | {"no relation": 0, "other": 0}
    with psycopg.connect(scratch.admin_dsn(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        rows = conn.execute(
            "SELECT (regexp_match(block_ref, 'rel \\d+/(\\d+)/'))[1]::oid AS db, sum(record_length)::bigint"
            " FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn) GROUP BY 1",
            (start, end),
        ).fetchall()
    for oid, size in rows:
        key = "no relation" if oid is None else oids.get(int(oid), "other")
        totals[key] += int(size)
    return totals


def _events(bench: castad_bench.CastadBench, ids: list[str]) -> dict[str, dict[str, float]]:
    """Per outbox: events published per pipeline, and the deliveries the topology routes them to."""
    routes = topology.Topology(bench.namespace)
    found: dict[str, dict[str, float]] = {}
    for service, url in bench.urls.items():
        with psycopg.connect(scratch.dsn(url), autocommit=True) as conn:
            keys = conn.execute(
                "SELECT routing_key, count(*) FROM outbox WHERE pipeline_id = ANY(%s) GROUP BY 1", (ids,)
            ).fetchall()
        published = sum(count for _, count in keys)
        delivered = sum(
            count * sum(any(topology.topic_matches(p, key) for p in routes.bindings(s)) for s in routes.services)
            for key, count in keys
        )
        found[service] = {"events": published / len(ids), "deliveries": delivered / len(ids)}
    return found


def orchestration(args: argparse.Namespace, cleanup: scratch.Cleanup, workdir: pathlib.Path) -> dict[str, Any]:
    with cleanup.scope():
        bench = castad_bench.CastadBench(cleanup, workdir)
        bench.setup()
        bench.start()
        bench.sequential(10, first=0)
        bench.throughput(args.pipelines // 2, args.concurrency, first=10, count_commits=False)  # warm up
        first = 10 + args.pipelines // 2
        stats_before = _database_stats(bench.databases)
        lsn_before = _wal_lsn()
        measured = bench.throughput(args.pipelines, args.concurrency, first, count_commits=True)
        lsn_after = _wal_lsn()  # throughput waited for the statistics to flush: the run's writes are in
        stats_after = _database_stats(bench.databases)
        with psycopg.connect(scratch.dsn(bench.urls["api"]), autocommit=True) as conn:  # the measured run's: the last
            query = "SELECT id::text FROM pipelines ORDER BY created_at DESC LIMIT %s"
            ids = [row[0] for row in conn.execute(query, (args.pipelines,))]
        names = dict(zip(bench.databases, bench.urls, strict=True))
        oids = {stats["oid"]: names[name] for name, stats in stats_after.items()}
        wal = wal_by_database(lsn_before, lsn_after, oids)
        return {
            "pipelines": args.pipelines,
            "concurrency": args.concurrency,
            "rate": measured["rate"],
            "cpu_ms": measured["cpu_ms_per_pipeline"],
            "commits": measured["commits_per_pipeline"],
            "rows": {
                names[name]: (stats_after[name]["rows"] - stats_before[name]["rows"]) / args.pipelines
                for name in bench.databases
            },
            "wal_bytes": {key: size / args.pipelines for key, size in wal.items()},
            "events": _events(bench, ids),
        }


# -- 2. ceilings of the shared parts ----------------------------------------------------------------


def ceilings(cleanup: scratch.Cleanup, workdir: pathlib.Path) -> dict[str, Any]:
    commits_ = notify.run(threads=32, per_thread=150, rounds=1, cleanup=cleanup)["totals"]["none"]
    relay = drain.run(cleanup, workdir, rows=30_000, per_pipeline=5, window=1000, rounds=1)
    return {
        "commits_per_s": commits_["rate"],
        "relay_rows_per_s": relay["relay"]["rate"],
        "relay_cpu_ms_per_1000_rows": relay["relay"]["cpu_ms_per_1000_rows"],
        "publish_rows_per_s": relay["raw"]["rate"],
    }


# -- 3. jobs waiting at a provider --------------------------------------------------------------------


def _awaiting(bench: castad_bench.CastadBench) -> int:
    with psycopg.connect(scratch.dsn(bench.urls["song"]), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM jobs WHERE status = 'AWAITING'").fetchone()
    return int(row[0]) if row else 0


def _polls(fake: suno.FakeSuno) -> int:
    return sum(1 for request in fake.received if isinstance(request, dict) and request.get("method") == "GET")


def waiting(args: argparse.Namespace, cleanup: scratch.Cleanup, workdir: pathlib.Path) -> dict[str, Any]:
    music = suno.FakeSuno(song_s=24 * 3600.0, audio_s=4.0)  # never finishes within the run
    fakes = {
        "chat": chat.FakeChat().start(),
        "suno": music.start(),
        "creatomate": creatomate.FakeCreatomate(render_s=5.0).start(),
    }
    try:
        with cleanup.scope():
            bench = providers.ProvidersBench(cleanup, workdir, fakes)
            bench.setup()
            bench.start()
            assert bench.stack is not None
            for number in range(args.waiting):
                bench.submit(number)
            deadline = time.monotonic() + 300
            while _awaiting(bench) < args.waiting:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{_awaiting(bench)} of {args.waiting} songs at the music API after 300 s")
                bench.stack.check_alive()
                time.sleep(0.5)
            time.sleep(args.window_s / 2)  # past the first polls, which come close together
            song_db = bench.urls["song"].rsplit("/", 1)[-1]
            parts = {
                "song": cpu.in_group(bench.stack.processes["song"].pid),
                "postgres": cpu.postgres_backends(song_db),
            }
            # Both readings of the commits lag by as long (a backend reports within 10 s), so their difference
            # counts a window as long as the one timed here.
            before = {name: cpu.snapshot(select) for name, select in parts.items()}
            commits_before, polls_before, started = (
                commits.read([song_db], settle=False),
                _polls(music),
                time.monotonic(),
            )
            time.sleep(args.window_s)
            polls, seconds = _polls(music) - polls_before, time.monotonic() - started
            after = {name: cpu.snapshot(select) for name, select in parts.items()}
            transactions = commits.read([song_db], settle=False)[song_db] - commits_before[song_db]
    finally:
        for fake in fakes.values():
            fake.stop()
    if not polls:
        raise RuntimeError(f"no poll of {args.waiting} waiting songs in {seconds:.0f} s")
    defaults = stage_service.StageSettings.model_fields
    return {
        "waiting": args.waiting,
        "window_s": seconds,
        "polls": polls,
        "polls_per_s": polls / seconds,
        "cpu_ms_per_poll": {name: cpu.used(before[name], after[name]) * 1000 / polls for name in before},
        "commits_per_poll": transactions / polls,
        "poll_first_s": defaults["poll_first_s"].default,
        "poll_max_s": defaults["poll_max_s"].default,
        "poll_max_called_back_s": stage_service.LinkingStageSettings.model_fields["poll_max_called_back_s"].default,
        "probe_batch": defaults["probe_batch"].default,
    }


# -- the model -------------------------------------------------------------------------------------------

SERVICES = (*topology.WITH_DATABASE, topology.RELAY)


def model(measured: dict[str, Any], rate: float = TARGET_RATE, waiting_jobs: int = TARGET_WAITING) -> dict[str, Any]:
    """What `rate` pipelines a second and `waiting_jobs` jobs at providers need, from the measured costs."""
    run, ceiling, wait = measured["orchestration"], measured["ceilings"], measured["waiting"]
    parts: dict[str, dict[str, float]] = {}
    for name in (*SERVICES, "postgres", "rabbitmq"):
        cores = run["cpu_ms"].get(name, 0.0) * rate / 1000
        parts[name] = {"cpu_ms": run["cpu_ms"].get(name, 0.0), "cores": cores}
        if name in SERVICES:
            parts[name]["replicas"] = math.ceil(cores / CORE_SHARE)
    databases = {}
    for service in run["commits"]:
        commits_s = run["commits"][service] * rate
        databases[service] = {
            "commits_per_s": commits_s,
            "rows_per_s": run["rows"][service] * rate,
            "wal_mb_per_s": run["wal_bytes"].get(service, 0.0) * rate / 1e6,
            "events_per_s": run["events"][service]["events"] * rate,
            "servers": math.ceil(commits_s / (ceiling["commits_per_s"] * DB_SHARE)),
            "outbox_leaders": math.ceil(run["events"][service]["events"] * rate / ceiling["relay_rows_per_s"]),
        }
    # A job waiting long is polled at the schedule's longest wait: with callbacks (the stages' providers call back
    # where the gateway's URL is set), the longer one of a safety net.
    polls_s = waiting_jobs / wait.get("poll_max_called_back_s", wait["poll_max_s"])
    poll_cores = {name: ms * polls_s / 1000 for name, ms in wait["cpu_ms_per_poll"].items()}
    return {
        "rate": rate,
        "waiting_jobs": waiting_jobs,
        "parts": parts,
        "databases": databases,
        "messages_per_s": sum(e["events"] for e in run["events"].values()) * rate,
        "deliveries_per_s": sum(e["deliveries"] for e in run["events"].values()) * rate,
        "polls_per_s": polls_s,
        "polls_per_s_without_callbacks": waiting_jobs / wait["poll_max_s"],
        "poll_cores": poll_cores,
        "poll_commits_per_s": wait["commits_per_poll"] * polls_s,
        "total_cores": sum(p["cores"] for p in parts.values()) + sum(poll_cores.values()),
    }


# -- the report ------------------------------------------------------------------------------------------


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/capacity.md.j2 from the measurements and their projection."""
    return pages.render(
        "capacity.md.j2",
        run=measured["orchestration"],
        ceiling=measured["ceilings"],
        wait=measured["waiting"],
        facts=measured["facts"],
        plan=model(measured),
        core_share=CORE_SHARE,
    )


def facts() -> dict[str, Any]:
    postgres = machine.postgres()
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "cpu": machine.cpu_model(),
        "postgres": f"{postgres['version']}, synchronous_commit {postgres['synchronous_commit']}",
        "load": " / ".join(f"{value:.2f}" for value in machine.load()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("capacity", __doc__)
    parser.add_argument("--pipelines", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--waiting", type=int, default=400, help="songs left waiting at the music API")
    parser.add_argument("--window-s", type=float, default=60.0, help="how long the waiting songs' polls are counted")
    args = parser.parse_args(argv)
    if args.pipelines < 1 or args.waiting < 1 or args.window_s <= 0:
        parser.error("--pipelines and --waiting must be at least 1, --window-s positive")
    measured: dict[str, Any] | None = None
    if not args.render:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
        logging.getLogger("bench").setLevel(logging.INFO)
        workdir = (scratch.REPO_ROOT / "var" / "capacity" / scratch.RUN_ID).resolve()
        cleanup = scratch.Cleanup()
        with scratch.interrupt_on_sigterm():
            measured = {"facts": facts()}
            measured["orchestration"] = orchestration(args, cleanup, workdir)
            measured["ceilings"] = ceilings(cleanup, workdir)
            measured["waiting"] = waiting(args, cleanup, workdir)
    pages.write(args.output, render, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
