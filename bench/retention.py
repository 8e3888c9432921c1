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

Written to docs/reports/retention.md, the measurements kept beside it in retention.json (`make
bench-retention`; `python -m bench.retention --render` writes the page again from them).
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
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

from bench import capacity

PREFILL = 1_500_000
WRITERS = 4
ROUND_S = 15.0
ROUNDS = 2
FILL = 300_000
DRAIN_S = 15.0
SERVICE_WRITERS = 2  # the service's own inserts beside retention
KEYS: dict[str, Callable[[], uuid.UUID]] = {"uuid4": uuid.uuid4, "uuid7": ids.time_ordered}
KEY_LABELS = {"uuid4": "random, version 4 (before)", "uuid7": "time-ordered, version 7 (now)"}
PRUNERS = {"fixed": "batches of `batch` rows (before)", "growing": "batches that grow while a backlog lasts (now)"}
STAGES = topology.STAGES
OUT = scratch.REPORTS / "retention.md"

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


def _n(value: float) -> str:
    return f"{value:,.0f}"


def render(measured: dict[str, Any]) -> str:
    facts, key, drain, needed = measured["facts"], measured["keys"], measured["retention"], measured["need"]
    medians = {
        variant: {what: statistics.median(r[what] for r in rounds) for what in ("rate", "wal_per_insert")}
        for variant, rounds in key["rounds"].items()
    }
    base = medians["uuid4"]
    key_rows = [
        f"| {KEY_LABELS[variant]} | {_n(m['rate'])} | {m['rate'] / base['rate']:.2f}x"
        f" | {', '.join(_n(r['rate']) for r in key['rounds'][variant])} | {_n(m['wal_per_insert'])}"
        f" | {m['wal_per_insert'] / base['wal_per_insert']:.2f}x |"
        for variant, m in medians.items()
    ]
    alone = drain["alone"]["writes"]
    drain_rows = [f"| no retention | | | | {_n(alone)} | 1.00x |"]
    for pruner, label in PRUNERS.items():
        for table in ("outbox", "inbox"):
            d = drain[pruner][table]
            drain_rows.append(
                f"| {label} | {table} | {_n(d['rate'])} | {_n(d['deleted'])} in {d['seconds']:.1f} s"
                f" | {_n(d['writes'])} | {d['writes'] / alone:.2f}x |"
            )
    fixed = min(drain["fixed"][t]["rate"] for t in ("outbox", "inbox"))
    growing = min(drain["growing"][t]["rate"] for t in ("outbox", "inbox"))
    need_rows = [
        f"| {database} | {_n(n['outbox'])} | {_n(n['inbox'])} | {_n(n['timeline'])} | {_n(n['total'])}"
        f" | {n['total'] / fixed:.1f} | {n['total'] / growing:.1f} | {n['servers']} | {_n(n['total'] / n['servers'])} |"
        for database, n in needed.items()
    ]
    api = needed["api"]
    per_server = api["total"] / api["servers"]
    kept_share = min(drain["growing"][table]["writes"] for table in ("outbox", "inbox")) / alone
    batch, pause_s = drain["fixed"]["outbox"]["batch"], drain["fixed"]["outbox"]["pause_s"]
    return "\n".join(
        [
            "# Keys and retention of the tables that only grow",
            "",
            "Generated by `make bench-retention` (bench/retention.py) from the measurements kept beside it in",
            "retention.json; `python -m bench.retention --render` writes it again from them.",
            "",
            f"Run {facts['date']} on {facts['cores']} cores, {facts['cpu']}; {facts['postgres']};",
            f"load average at the start {facts['load']}.",
            "",
            "## Keys: random against time-ordered",
            "",
            f"{key['writers']} writers insert one row a transaction into an inbox-shaped table (a UUID primary key",
            f"and an index on received_at) that holds {_n(key['prefill'])} rows already, for {key['round_s']:g} s a",
            "round after a CHECKPOINT, the variants alternating. The writers commit with synchronous_commit off:",
            "what is measured is what an insert costs in the index and the WAL, not the wait for the disk every",
            "commit has whatever its key. WAL bytes: the records of the benchmark's database's blocks (read with",
            "pg_walinspect), so that other work on the server is left out; commit records (the same whatever the",
            "key) are left out too.",
            "",
            "| keys | inserts/s (median round) | of before | per round | WAL bytes an insert | of before |",
            "|---|---:|---:|---|---:|---:|",
            *key_rows,
            "",
            "A random key dirties a leaf page of its own on almost every insert, and the first change to a page",
            "after a checkpoint writes the whole page into the WAL; time-ordered keys land on the index's last page,",
            "as a sequence's do. The WAL is what the key changes at once: what the disk flushes, a standby",
            "replays and the archive keeps. The rate depends little on the key while the index stays in memory,",
            f"as {_n(key['prefill'])} keys do here; once it does not, each random key's page is read from disk first.",
            "The event ids (the outbox's event_id, the inbox's key, the timeline's event_id),",
            "the stages' job ids and the webhook notices' ids are time-ordered now (castad_contracts.ids); a",
            "pipeline's id stays random: every URL of it names it.",
            "",
            "## Retention: rows deleted a second by one pruner",
            "",
            "The project's own step (castad_runtime.retention.shared_steps) on an outbox and an inbox holding",
            f"{_n(drain['fill'])} rows each, all past their retention, for {drain['drain_s']:g} s each or until none",
            f"is left; the settings' batch ({batch} rows) and pause ({pause_s:g} s between two batches). Before:",
            "every batch that size, the same pause after each. Now: a full batch that took under"
            f" {drain['quick_s']:g} s doubles the next, up to {_n(drain['max_batch'])} rows,",
            "and one that took longer halves it; the pause after a batch is the settings' or longer, so that",
            f"deleting takes at most {drain['busy_share']:.0%} of the pruner's time. Meanwhile"
            f" {drain['service_writers']} writers",
            "insert into an inbox-shaped table as above (time-ordered keys): the service's own work, which must",
            "go first. Without retention (before the pruners ran and after: the mean) they inserted at the rate",
            "in the first row.",
            "",
            "| pruner | table | rows deleted/s | deleted | the service's inserts/s meanwhile | of no retention |",
            "|---|---|---:|---:|---:|---:|",
            *drain_rows,
            "",
            f"## What retention must delete at {_n(capacity.TARGET_RATE)} pipelines a second (projected)",
            "",
            "Rows a second each database writes into its outbox, inbox and timeline (from the capacity model's",
            "measured events per pipeline; the gateway's inbox gets every stage event, a stage's its trigger, the",
            "timeline an entry for the request and each stage event), the pruners that would take at the",
            "measured rates (the slower table's), and the same per server where the capacity model splits the",
            "database over servers at half this machine's commit ceiling. **Projected.**",
            "",
            "| database | outbox rows/s | inbox rows/s | timeline rows/s | all | pruners before | pruners now"
            " | servers (capacity model) | rows/s a server |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *need_rows,
            "",
            "## Whether to partition",
            "",
            f"One pruner deleted {_n(fixed)} rows a second before (the slower table's) and {_n(growing)} now,",
            f"the service's inserts beside it at {kept_share:.2f} of their rate without it at the least. Before,",
            f"the pause capped a pruner at a batch a pause ({_n(batch / pause_s)} rows a second) whatever the",
            "database could do. The gateway's",
            f"database writes {_n(api['total'])} such rows a second at that rate: {api['total'] / fixed:.1f}"
            f" pruners' worth before, {api['total'] / growing:.1f} now,",
            "each a replica's thread (every replica of a service runs one; those whose rounds meet share a",
            f"backlog through SKIP LOCKED). The capacity model splits that database over {api['servers']} servers",
            f"for its commits alone, which leaves {_n(per_server)} rows a second to delete on each,"
            f" {per_server / growing:.2f} of one",
            f"pruner now; on servers ten times faster (a tenth as many) {per_server * 10 / growing:.2f}. The",
            "timeline's step (a join with the pipelines, to keep a running pipeline's) was not measured here.",
            "",
            "Range partitions by time, dropped whole instead of deleted, would save the DELETE, its WAL and the",
            "VACUUM that comes after it (not measured here). They would cost: a primary key or unique index on a",
            "partitioned table must include the partition key, so the outbox's event_id and the inbox's",
            "event_id could no longer be unique across partitions, and the inbox's dedupe (an insert that",
            "conflicts on event_id) would see duplicates within one partition only: a copy of an event coming",
            "after its partition's turn would be taken as new, unless every insert also looked in the older",
            "partitions. Partitions would have to be made ahead and dropped on time in each of the four",
            "databases, by their migrations and a job of their own, and the relay's scan of unpublished rows",
            "would span them. With time-ordered keys and batches that grow while a backlog lasts, one pruner",
            "deletes a server's share of the projected rate with room to spare at these figures, so the tables stay",
            "unpartitioned; partitioning is the next step if a server's rows to delete come near what its",
            "pruners delete, and the inbox's dedupe would then need a table of event ids of its own.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__)
    parser.add_argument("--render", action="store_true", help="write the page again from retention.json, run nothing")
    parser.add_argument("--output", type=pathlib.Path, default=OUT)
    args = parser.parse_args(argv)
    kept = args.output.with_suffix(".json")
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
        kept.write_text(json.dumps(measured, indent=1) + "\n")
    args.output.write_text(render(json.loads(kept.read_text())))
    scratch.log.info("wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
