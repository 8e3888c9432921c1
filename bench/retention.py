"""Tables that grow by insert and shrink by retention's DELETE: what their keys cost, and whether retention keeps up.

In a scratch database it creates and drops:

- **keys**: `WRITERS` threads insert rows one a transaction, as a consumer records an event it handles, into
  an inbox-shaped table (castad_runtime.tables.inbox: a UUID primary key and an index on received_at) that
  already holds `PREFILL` rows; keys random (version 4, before) or time-ordered (version 7, now:
  castad_contracts.ids). Each round begins with a CHECKPOINT, as any stretch between two of them does, and
  runs `ROUND_S`; the variants alternate over `ROUNDS` rounds. Measured: inserts a second and WAL bytes an
  insert. The writers commit with synchronous_commit off, so that what is measured is the insert's own
  cost in the index and the WAL, not the wait for the disk that every commit has whatever its key.
- **retention**: the project's own step (castad_runtime.retention's Pruner and shared_steps, with the
  settings' batch and pause) deletes from an outbox and an inbox holding `FILL` rows each, all past their
  retention, for `DRAIN_S` each or until none is left: rows deleted a second by one pruner, batches that
  never grow (before) and batches that grow while a backlog lasts (now), and meanwhile the inserts a second
  of `SERVICE_WRITERS` writers as above (the service's own work), against theirs without retention. Compared
  with the rows each database writes into those tables at the capacity model's rate (docs/reports/capacity.json).

Written to docs/reports/retention.md by bench/templates/retention.md.j2, the measurements kept beside it in
retention.json (`make bench-retention`; `python -m bench.retention --render` writes the page again from them).
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import sqlalchemy as sa
from castad_contracts import ids, topology
from castad_runtime import db, migrations, retention, settings, tables
from castad_testkit import machine, scratch

from bench import capacity, pages

PREFILL = 1_500_000
WRITERS = 4
ROUND_S = 15.0
ROUNDS = 2
FILL = 300_000
DRAIN_S = 15.0
SERVICE_WRITERS = 2  # the service's own inserts beside retention
KEYS: dict[str, Callable[[], uuid.UUID]] = {"uuid4": uuid.uuid4, "uuid7": ids.time_ordered}
PRUNERS = ("fixed", "growing")  # batches of the settings' size (before), batches that grow while a backlog lasts (now)
STAGES = topology.STAGES

# A version 7 UUID made by the database, for the rows already there: the time's milliseconds in the first 48 bits
# of a random UUID, and its version bits (0100) made 0111.
UUID7_SQL = """
CREATE FUNCTION bench_uuid7(at timestamptz) RETURNS uuid LANGUAGE sql VOLATILE AS $$
SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
    PLACING substring(int8send((extract(epoch FROM at) * 1000)::bigint) FROM 3) FROM 1 FOR 6), 52, 1), 53, 1),
    'hex')::uuid
$$
"""
PREFILL_SQL = """
INSERT INTO {table} (event_id, event_type, pipeline_id, received_at)
SELECT {key}, 'lyric.completed', gen_random_uuid()::text, at
FROM (SELECT now() - (%(rows)s - n) * interval '1 millisecond' AS at FROM generate_series(1, %(rows)s) AS n) AS s
"""
RECORD_SQL = "INSERT INTO {table} (event_id, event_type, pipeline_id) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
FILL_OUTBOX = """
INSERT INTO outbox (event_id, pipeline_id, routing_key, envelope, created_at, published_at)
SELECT bench_uuid7(at), gen_random_uuid()::text, 'lyric.completed', %(envelope)s::jsonb, at, at
FROM (SELECT now() - interval '8 days' - (%(rows)s - n) * interval '1 millisecond' AS at
      FROM generate_series(1, %(rows)s) AS n) AS s
"""
FILL_INBOX = """
INSERT INTO inbox (event_id, event_type, pipeline_id, received_at)
SELECT bench_uuid7(at), 'lyric.completed', gen_random_uuid()::text, at
FROM (SELECT now() - interval '31 days' - (%(rows)s - n) * interval '1 millisecond' AS at
      FROM generate_series(1, %(rows)s) AS n) AS s
"""
# An envelope of the size a stage's completion carries (its brief and artifact), for the outbox's rows.
ENVELOPE = json.dumps({"specversion": "1.0", "type": "lyric.completed", "data": {"brief": "x" * 600}})


def _lsn(conn: psycopg.Connection[Any]) -> str:
    return str(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]


def _own_wal(conn: psycopg.Connection[Any], start: str, end: str) -> int:
    """WAL bytes between two positions of the records whose first block is in this database (pg_walinspect).

    Other work on the server is left out, and so are commit records, which name no block (one a transaction,
    whatever its key)."""
    while conn.execute("SELECT pg_current_wal_flush_lsn() < %s::pg_lsn", (end,)).fetchone()[0]:  # type: ignore[index]
        time.sleep(0.1)  # commits without a flush (synchronous_commit off): their WAL is read once written out
    oid = int(conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0])  # type: ignore[index]
    return capacity.wal_by_database(start, end, {oid: "own"})["own"]


def _prefill(conn: psycopg.Connection[Any], variant: str) -> None:
    table = f"inbox_{variant}"
    conn.execute(f"CREATE TABLE {table} (LIKE inbox INCLUDING ALL)")
    key = "gen_random_uuid()" if variant == "uuid4" else "bench_uuid7(at)"
    conn.execute(PREFILL_SQL.format(table=table, key=key), {"rows": PREFILL})
    conn.execute(f"VACUUM ANALYZE {table}")


def _writing(
    url: str, variant: str, writers: int, during: Callable[[], None], count_wal: bool = False
) -> dict[str, float]:
    """`writers` threads inserting one row a transaction into `inbox_<variant>` while `during()` runs.

    Inserts a second, and the database's WAL bytes (`_own_wal`), from when every writer is connected and
    `during` starts until it returns. A CHECKPOINT first, as any stretch between two of them begins.
    """
    make = KEYS[variant]
    statement = RECORD_SQL.format(table=f"inbox_{variant}")
    barrier = threading.Barrier(writers + 1)
    counts = [0] * writers
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(index: int) -> None:
        try:
            with psycopg.connect(scratch.dsn(url)) as conn:
                conn.execute("SET synchronous_commit = off")
                conn.commit()
                barrier.wait()
                while not stop.is_set():
                    conn.execute(statement, (make(), "lyric.completed", "p"))
                    conn.commit()
                    counts[index] += 1
        except BaseException as error:
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=writer, args=(i,), name=f"writer-{i}") for i in range(writers)]
    with psycopg.connect(scratch.dsn(url), autocommit=True) as admin:
        admin.execute("CHECKPOINT")
        for thread in threads:
            thread.start()
        try:
            barrier.wait()
            started, start_lsn = time.perf_counter(), _lsn(admin)
            during()
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        elapsed, end_lsn = time.perf_counter() - started, _lsn(admin)
        wal = _own_wal(admin, start_lsn, end_lsn) if count_wal else 0
    if errors:
        raise errors[0]
    inserted = sum(counts)
    return {"inserts": inserted, "seconds": elapsed, "rate": inserted / elapsed, "wal": wal}


def _insert_round(url: str, variant: str) -> dict[str, float]:
    """`WRITERS` writers for `ROUND_S`: inserts a second, WAL bytes an insert."""
    wrote = _writing(url, variant, WRITERS, lambda: time.sleep(ROUND_S), count_wal=True)
    return {"inserts": wrote["inserts"], "rate": wrote["rate"], "wal_per_insert": wrote["wal"] / wrote["inserts"]}


def keys(url: str) -> dict[str, Any]:
    with psycopg.connect(scratch.dsn(url), autocommit=True) as conn:
        for variant in KEYS:
            started = time.perf_counter()
            _prefill(conn, variant)
            scratch.log.info("%s: %d rows in %.0f s", variant, PREFILL, time.perf_counter() - started)
    rounds: dict[str, list[dict[str, float]]] = {variant: [] for variant in KEYS}
    for number in range(ROUNDS):
        for variant in KEYS if number % 2 == 0 else list(KEYS)[::-1]:
            rounds[variant].append(_insert_round(url, variant))
            last = rounds[variant][-1]
            scratch.log.info("%s: %.0f inserts/s, %.0f WAL bytes each", variant, last["rate"], last["wal_per_insert"])
    return {"prefill": PREFILL, "writers": WRITERS, "round_s": ROUND_S, "rounds": rounds}


def _fill(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        raw.execute(FILL_OUTBOX, {"rows": FILL, "envelope": ENVELOPE})
        raw.execute(FILL_INBOX, {"rows": FILL})
        raw.commit()
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("VACUUM ANALYZE outbox, inbox"))


def _drain(url: str, step: retention.Step, pruner: str | None) -> dict[str, float]:
    """One pruner running `step` for `DRAIN_S` or until nothing is left, beside `SERVICE_WRITERS` writers.

    Rows it deleted a second, and the writers' inserts a second meanwhile (`pruner` None: the writers alone).
    """
    defaults = settings.CommonSettings.model_fields
    batch, pause_s = defaults["retention_batch"].default, defaults["retention_pause_s"].default
    if pruner is None:
        alone = _writing(url, "uuid7", SERVICE_WRITERS, lambda: time.sleep(DRAIN_S))
        return {"writes": alone["rate"]}
    now = pruner == "growing"
    running = retention.Pruner(
        [step],
        interval_s=60,
        batch=batch,
        pause_s=pause_s,
        max_batch=retention.MAX_BATCH if now else batch,
        busy_share=retention.BUSY_SHARE if now else 1.0,
    )
    done: dict[str, int] = {}

    def prune() -> None:
        thread = threading.Thread(target=lambda: done.update(running.run_once()), name="retention")
        thread.start()
        thread.join(DRAIN_S)
        running.stop()
        thread.join()

    wrote = _writing(url, "uuid7", SERVICE_WRITERS, prune)
    deleted = done[step.what]
    return {
        "deleted": deleted,
        "seconds": wrote["seconds"],
        "rate": deleted / wrote["seconds"],
        "writes": wrote["rate"],
        "batch": batch,
        "pause_s": pause_s,
    }


def drains(url: str, cleanup: scratch.Cleanup) -> dict[str, Any]:
    engine = db.make_engine(url, pool_size=2)
    cleanup.push("dispose the retention engine", engine.dispose)
    tables.metadata.create_all(engine, tables=[tables.outbox])
    steps = retention.shared_steps(engine, settings.CommonSettings())
    first = _drain(url, steps[0], None)
    found: dict[str, Any] = {}
    for pruner in PRUNERS:
        _fill(engine)
        for step, table in zip(steps, ("outbox", "inbox"), strict=True):
            found.setdefault(pruner, {})[table] = _drain(url, step, pruner)
            last = found[pruner][table]
            scratch.log.info(
                "%s %s: %.0f rows/s (%d rows), the writers' %.0f/s",
                pruner,
                table,
                last["rate"],
                last["deleted"],
                last["writes"],
            )
        with engine.begin() as conn:
            conn.execute(sa.text("TRUNCATE outbox, inbox"))
    # The writers alone, before and after the pruners (their table grows meanwhile): the mean of the two.
    found["alone"] = {"writes": (first["writes"] + _drain(url, steps[0], None)["writes"]) / 2}
    return {
        "fill": FILL,
        "drain_s": DRAIN_S,
        "service_writers": SERVICE_WRITERS,
        "max_batch": retention.MAX_BATCH,
        "quick_s": retention.QUICK_S,
        "busy_share": retention.BUSY_SHARE,
        **found,
    }


def need(kept: dict[str, Any], rate: float = capacity.TARGET_RATE) -> dict[str, dict[str, float]]:
    """Rows a second each database writes into its outbox, inbox and timeline at `rate` pipelines a second.

    From the capacity model's measurements: a database's outbox gets its events; the gateway's inbox every stage
    event (it subscribes to them all) and a stage's inbox its one trigger; the gateway's timeline an entry for
    the request and for each stage event.
    """
    run = kept["orchestration"]
    stage_events = sum(run["events"][stage]["events"] for stage in STAGES)
    servers = capacity.model(kept, rate=rate)["databases"]
    found = {}
    for database in ("api", *STAGES):
        outbox = run["events"][database]["events"] * rate
        inbox = (stage_events if database == "api" else 1.0) * rate
        timeline = (stage_events + run["events"]["api"]["events"]) * rate if database == "api" else 0.0
        found[database] = {
            "outbox": outbox,
            "inbox": inbox,
            "timeline": timeline,
            "total": outbox + inbox + timeline,
            "servers": servers[database]["servers"],
        }
    return found


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/retention.md.j2 from the measurements and what they come to."""
    key, drain, needed = measured["keys"], measured["retention"], measured["need"]
    alone = drain["alone"]["writes"]
    growing = min(drain["growing"][table]["rate"] for table in ("outbox", "inbox"))
    return pages.render(
        "retention.md.j2",
        facts=measured["facts"],
        key=key,
        drain=drain,
        needed=needed,
        target_rate=capacity.TARGET_RATE,
        medians={
            variant: {what: statistics.median(r[what] for r in rounds) for what in ("rate", "wal_per_insert")}
            for variant, rounds in key["rounds"].items()
        },
        alone=alone,
        fixed=min(drain["fixed"][table]["rate"] for table in ("outbox", "inbox")),
        growing=growing,
        kept_share=min(drain["growing"][table]["writes"] for table in ("outbox", "inbox")) / alone,
        per_server=needed["api"]["total"] / needed["api"]["servers"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("retention", __doc__)
    args = parser.parse_args(argv)
    measured: dict[str, Any] | None = None
    if not args.render:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        load = machine.load()
        url = scratch.database_url(f"castad_bench_{scratch.RUN_ID}_retention")
        cleanup = scratch.Cleanup()
        with scratch.interrupt_on_sigterm(), cleanup.scope():
            migrations.drop_database(url)
            migrations.ensure_database(url)
            cleanup.push("drop the retention database", lambda: migrations.drop_database(url))
            with psycopg.connect(scratch.dsn(url), autocommit=True) as conn:
                conn.execute(UUID7_SQL)
            engine = db.make_engine(url, pool_size=1)
            cleanup.push("dispose its engine", engine.dispose)
            tables.metadata.create_all(engine, tables=[tables.inbox])
            measured = {"facts": machine.brief_facts(load), "keys": keys(url), "retention": drains(url, cleanup)}
        capacity_kept = json.loads((scratch.REPORTS / "capacity.json").read_text())
        measured["need"] = need(capacity_kept)
    pages.write(args.output, render, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
