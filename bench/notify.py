"""C. The NOTIFY question: commit rate of concurrent outbox writers by where the NOTIFY goes.

Writers are threads, each with its own pooled connection, each transaction inserting one
outbox row (castad_runtime.tables.outbox, a small envelope) through
castad_runtime.db.transaction, on a scratch database, while one connection LISTENs on
the outbox channel like the relay does:

- `none`: no notification at all (the floor: what the inserts and commits cost);
- `after_commit`: NOTIFY in a statement of its own after the commit (an autocommit
  statement on the same connection: Castad's way until the outbox had its trigger);
- `in_transaction`: the outbox's own trigger NOTIFYs inside the writing transaction
  (castad_runtime.migration_ops.add_outbox_notify_v6: Castad's way until the waker);
- `waker`: the process's waker NOTIFYs from a thread of its own once the writer committed,
  coalescing the wake-ups that came meanwhile (castad_runtime.wakeups: Castad's way now).

The first three run once more with pgbench (PostgreSQL's C client, if installed) as the
writers, so that the server's side shows without the Python client's cost (a waker is the
services' own thread: pgbench has none).
"""

from __future__ import annotations

import glob
import re
import shutil
import statistics
import subprocess
import threading
import time
import uuid
from typing import Any

import psycopg
import sqlalchemy as sa
from castad_runtime import db, migrations, tables, wakeups
from castad_testkit import latency, scratch

VARIANTS = ("none", "after_commit", "in_transaction", "waker")
PGBENCH_VARIANTS = VARIANTS[:3]


class _Listener(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(name="notify-listener", daemon=True)
        self.conn = psycopg.connect(scratch.dsn(url), autocommit=True)
        self.conn.execute(f"LISTEN {db.OUTBOX_CHANNEL}")
        self.received = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            for _ in self.conn.notifies(timeout=0.2):
                self.received += 1

    def stop(self) -> None:
        self.stopping.set()
        self.join()
        self.conn.close()


def _transaction(engine: sa.Engine, variant: str, row: dict[str, Any]) -> None:
    if variant == "waker":
        with db.transaction(engine) as conn:
            conn.execute(tables.outbox.insert().values(**row))
            wakeups.after_commit(conn, db.OUTBOX_CHANNEL)
        return
    with engine.connect() as conn:
        with conn.begin():
            conn.execute(tables.outbox.insert().values(**row))
        if variant == "after_commit":
            conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(sa.select(sa.func.pg_notify(db.OUTBOX_CHANNEL, "")))


TRIGGER = f"""
CREATE OR REPLACE FUNCTION bench_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('{db.OUTBOX_CHANNEL}', ''); RETURN NULL; END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION bench_outbox_notify();
"""


def _prepare(engine: sa.Engine, variant: str) -> None:
    """An empty outbox after a checkpoint, with the trigger only for `in_transaction`."""
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TRIGGER IF EXISTS outbox_notify ON outbox"))
        if variant == "in_transaction":
            conn.execute(sa.text(TRIGGER))
        conn.execute(sa.text("TRUNCATE outbox"))
        conn.execute(sa.text("CHECKPOINT"))


def _row() -> dict[str, Any]:
    event_id = uuid.uuid4()
    return {
        "event_id": event_id,
        "pipeline_id": str(event_id),
        "routing_key": "bench.written",
        "envelope": {"specversion": "1.0", "id": str(event_id), "type": "bench.written", "data": {"n": 1}},
    }


def _one_run(engine: sa.Engine, variant: str, threads: int, per_thread: int) -> dict[str, Any]:
    barrier = threading.Barrier(threads + 1)
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        rows = [_row() for _ in range(per_thread)]
        mine = latencies[index]
        barrier.wait()
        try:
            for row in rows:
                started = time.perf_counter()
                _transaction(engine, variant, row)
                mine.append(time.perf_counter() - started)
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=writer, args=(i,), name=f"writer-{i}") for i in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    flat = [value for per in latencies for value in per]
    return {
        "variant": variant,
        "commits": len(flat),
        "seconds": elapsed,
        "latency_ms": latency.summary(latency.ms(flat)),
    }


def run(
    threads: int = 8, per_thread: int = 1000, rounds: int = 2, cleanup: scratch.Cleanup | None = None
) -> dict[str, Any]:
    """Commit rates of each variant; rounds interleave the variants (rotating their order)."""
    url = scratch.database_url(f"castad_bench_{scratch.RUN_ID}_notify")
    owned = cleanup or scratch.Cleanup()
    with owned.scope():
        migrations.drop_database(url)
        migrations.ensure_database(url)
        owned.push("drop notify database", lambda: migrations.drop_database(url))
        engine = db.make_engine(url, pool_size=threads)
        owned.push("dispose notify engine", engine.dispose)
        owned.push("stop the wakers", wakeups.close_all)
        tables.outbox.create(engine)
        listener = _Listener(url)
        listener.start()
        owned.push("stop notify listener", listener.stop)
        # Warm the pool and the server's caches before measuring.
        for _ in range(threads * 10):
            _transaction(engine, "none", _row())
        runs: list[dict[str, Any]] = []
        for number in range(rounds):
            order = VARIANTS[number % len(VARIANTS) :] + VARIANTS[: number % len(VARIANTS)]
            for variant in order:
                _prepare(engine, variant)
                result = _one_run(engine, variant, threads, per_thread)
                result["round"] = number + 1
                runs.append(result)
                scratch.log.info(
                    "notify %-14s round %d: %6.0f commits/s", variant, number + 1, result["commits"] / result["seconds"]
                )
        received = listener.received
    totals = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        commits = sum(r["commits"] for r in mine)
        seconds = sum(r["seconds"] for r in mine)
        totals[variant] = {
            "commits": commits,
            "seconds": seconds,
            "rate": commits / seconds,
            "round_rates": [r["commits"] / r["seconds"] for r in mine],
            "latency_p50_ms": latency.percentile([r["latency_ms"]["p50"] for r in mine], 50),
            "latency_p99_ms": max(r["latency_ms"]["p99"] for r in mine),
        }
    return {
        "threads": threads,
        "per_thread": per_thread,
        "rounds": rounds,
        "runs": runs,
        "totals": totals,
        "notifications_received": received,
    }


_INSERT = (
    "INSERT INTO outbox (event_id, pipeline_id, routing_key, envelope)"
    " VALUES (gen_random_uuid(), 'p', 'bench.written', '{}');"
)
_NOTIFY = f"SELECT pg_notify('{db.OUTBOX_CHANNEL}', '');"
PGBENCH_SCRIPTS = {
    "none": f"BEGIN;\n{_INSERT}\nCOMMIT;\n",
    "after_commit": f"BEGIN;\n{_INSERT}\nCOMMIT;\n{_NOTIFY}\n",
    "in_transaction": f"BEGIN;\n{_INSERT}\nCOMMIT;\n",  # the trigger NOTIFYs
}


def pgbench_path() -> str | None:
    found = shutil.which("pgbench")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))
    return candidates[-1] if candidates else None


def run_pgbench(
    workdir: str, threads: int = 8, per_thread: int = 1000, rounds: int = 2, cleanup: scratch.Cleanup | None = None
) -> dict[str, Any] | None:
    """Commit rates of the same variants with pgbench as the writers; None without pgbench."""
    binary = pgbench_path()
    if binary is None:
        return None
    url = scratch.database_url(f"castad_bench_{scratch.RUN_ID}_pgbench")
    parsed = sa.engine.make_url(url)
    owned = cleanup or scratch.Cleanup()
    runs: list[dict[str, Any]] = []
    with owned.scope():
        migrations.drop_database(url)
        migrations.ensure_database(url)
        owned.push("drop pgbench database", lambda: migrations.drop_database(url))
        engine = db.make_engine(url, pool_size=1)
        owned.push("dispose pgbench engine", engine.dispose)
        tables.outbox.create(engine)
        listener = _Listener(url)
        listener.start()
        owned.push("stop pgbench listener", listener.stop)
        scripts = {}
        for variant, text in PGBENCH_SCRIPTS.items():
            path = f"{workdir}/pgbench-{variant}.sql"
            with open(path, "w", encoding="utf-8") as script:
                script.write(text)
            scripts[variant] = path
        base = [binary, "-n", "-h", parsed.host or "127.0.0.1", "-p", str(parsed.port or 5432)]
        base += ["-U", parsed.username or "postgres", "-c", str(threads), "-j", str(min(threads, 2))]
        for number in range(rounds):
            order = PGBENCH_VARIANTS[number % 3 :] + PGBENCH_VARIANTS[: number % 3]
            for variant in order:
                _prepare(engine, variant)
                command = [*base, "-t", str(per_thread), "-f", scripts[variant], parsed.database or ""]
                result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
                if result.returncode != 0:
                    raise RuntimeError(f"pgbench failed: {result.stderr.strip()[-500:]}")
                tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", result.stdout)
                latency = re.search(r"latency average = ([0-9.]+) ms", result.stdout)
                if tps is None or latency is None:
                    raise RuntimeError(f"cannot read pgbench's output: {result.stdout[-500:]}")
                runs.append(
                    {"variant": variant, "round": number + 1, "rate": float(tps[1]), "latency_ms": float(latency[1])}
                )
                scratch.log.info("pgbench %-14s round %d: %6.0f commits/s", variant, number + 1, float(tps[1]))
    totals = {
        variant: {
            "rate": statistics.fmean([r["rate"] for r in runs if r["variant"] == variant]),
            "round_rates": [r["rate"] for r in runs if r["variant"] == variant],
            "latency_avg_ms": statistics.fmean([r["latency_ms"] for r in runs if r["variant"] == variant]),
        }
        for variant in PGBENCH_VARIANTS
    }
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return {
        "threads": threads,
        "per_thread": per_thread,
        "rounds": rounds,
        "runs": runs,
        "totals": totals,
        "pgbench": version,
    }
