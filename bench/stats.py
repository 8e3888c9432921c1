"""The operator's statistics and the listing's search on a million pipelines.

Each statement timed, its plan recorded.

A scratch database is migrated as the gateway's, filled with `INSERT ... SELECT generate_series` (1,000,000
pipelines created over 30 days, their stages, their attempts, dead letters), vacuumed and analysed; then
every statement of castad_api.stats runs for windows of 15 minutes to 7 days, `stats.read` as /v1/stats
calls it, and the listing's search (castad_api.listing.listing) by id and by parts of names. Results,
with `EXPLAIN (ANALYZE, BUFFERS)` of each, go to docs/reports/stats.md, written by bench/templates/stats.md.j2 from
the measurements kept beside it in stats.json (`--render` writes the page again from them). The database is dropped
at the end, however the run ends.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from castad_api import listing, stats
from castad_api.listing import RECENT
from castad_local import stack
from castad_runtime import migrations
from castad_testkit import machine, scratch

from bench import pages

WINDOWS = ("15m", "1h", "24h", "7d")
EXPLAINED_WINDOWS = ("1h", "7d")
STUCK_AFTER_S = 1860.0
IN_FLIGHT_ONLY = ("in_flight", "places", "stuck", "dead_letters_open")  # the window does not change them
API_MIGRATIONS = next(database.migrations_dir for database in stack.DATABASES if database.service == "api")

# Pipeline n (1 = the newest) was created n / pipelines of 30 days ago: a million, ~1,400 an hour. The newest
# 463 are in flight, and one in 10,007 older ones is stuck in its song. Its customer's name is one of ten
# words ("Cafe", "바다", "책방", ...) and a number below 99,991; its tenant is one of ten, and each tenant's
# customers are of one kind: t0's are all cafés, t3's all hanok stays (a search for "cafe" as t3 finds none).
LOAD = {
    "pipelines": """
INSERT INTO pipelines (id, tenant, idempotency_key, request_hash, brief, status, current_stage, progress,
                       error_code, created_at, updated_at, finished_at, deadline_at, trace_id)
SELECT id, tenant, '5:' || tenant || '/' || n, md5(n::text),
       jsonb_build_object(
           'customer_name', (ARRAY['Cafe', 'Bakery', '바다', '한옥', 'Studio', 'Salon', 'Garden', '책방', 'Bistro',
                                   'Market'])[n % 10 + 1] || ' ' || (n % 99991),
           'region', (ARRAY['Busan', '군산', 'Seoul', '속초', 'Jeju'])[n % 5 + 1],
           'language', 'Korean', 'genre', 'pop, ambient', 'orientation', 'vertical', 'duration_s', 30),
       status,
       CASE status WHEN 'PENDING' THEN NULL WHEN 'SUCCEEDED' THEN 'video' ELSE 'song' END,
       CASE status WHEN 'SUCCEEDED' THEN 100 WHEN 'PENDING' THEN 0 ELSE 33 END,
       CASE status WHEN 'FAILED' THEN 'content_refused' WHEN 'CANCELED' THEN 'canceled' END,
       created_at, created_at, CASE WHEN status IN ('SUCCEEDED', 'FAILED', 'CANCELED')
                                    THEN created_at + make_interval(secs => 60 + n % 240) END,
       created_at + interval '2 hours', md5('trace' || n)
FROM (
    SELECT n, md5(n::text)::uuid AS id, 't' || (n % 10) AS tenant,
           now() - make_interval(secs => n * 2592000.0 / :pipelines) AS created_at,
           CASE WHEN n <= 463 THEN (ARRAY['PENDING', 'RUNNING', 'RUNNING', 'RUNNING'])[n % 4 + 1]
                WHEN n % 10007 = 0 THEN 'RUNNING'
                WHEN n % 50 = 0 THEN 'FAILED'
                WHEN n % 97 = 0 THEN 'CANCELED'
                ELSE 'SUCCEEDED' END AS status
    FROM generate_series(1, :pipelines) AS n
) AS made""",
    # lyric, song and video one after the other; a failed pipeline fails in its song, a canceled one is
    # canceled in its song; one in three in flight waits for its song's next attempt; one in ten stages
    # needed a second attempt.
    "pipeline_stages": """
INSERT INTO pipeline_stages (pipeline_id, stage, status, rank, attempt, step, max_attempts, last_error_code,
                             started_at, first_started_at, finished_at, artifact)
SELECT id, stage, status, CASE WHEN status IN ('RUNNING', 'RETRY_WAIT') THEN 1 ELSE 2 END, attempts, 0, 5,
       CASE status WHEN 'FAILED' THEN 'content_refused' WHEN 'CANCELED' THEN 'canceled' END,
       first_start + make_interval(secs => (attempts - 1) * 5), first_start,
       CASE WHEN status IN ('SUCCEEDED', 'FAILED', 'CANCELED') THEN first_start + make_interval(secs => took) END,
       CASE WHEN status = 'SUCCEEDED' THEN jsonb_build_object('uri', 'file:///a', 'sha256', repeat('0', 64),
                                                              'size', 1, 'media_type', 'text/plain') END
FROM (
    SELECT p.id, s.stage,
           CASE WHEN p.status = 'SUCCEEDED' OR s.position = 1 THEN 'SUCCEEDED'
                WHEN p.status = 'FAILED' THEN 'FAILED'
                WHEN p.status = 'CANCELED' THEN 'CANCELED'
                WHEN md5(p.id::text) < '5' THEN 'RETRY_WAIT'
                ELSE 'RUNNING' END AS status,
           CASE WHEN get_byte(decode(md5(p.id::text || s.stage), 'hex'), 0) < 26 THEN 2 ELSE 1 END AS attempts,
           CASE WHEN p.status = 'RUNNING' AND s.position = 2 AND p.created_at < now() - interval '1 hour'
                THEN now() - interval '2 hours'
                ELSE p.created_at + make_interval(secs => s.position * 20) END AS first_start,
           s.base_s + get_byte(decode(md5(p.id::text || s.stage), 'hex'), 1) % s.spread_s AS took
    FROM pipelines p
    CROSS JOIN (VALUES ('lyric', 1, 5, 20), ('song', 2, 20, 60), ('video', 3, 10, 30))
        AS s (stage, position, base_s, spread_s)
    WHERE p.status <> 'PENDING' AND (p.status IN ('SUCCEEDED', 'CANCELED') OR s.position <= 2)
) AS staged""",
    "pipeline_attempts": """
INSERT INTO pipeline_attempts (pipeline_id, stage, attempt, worker, started_at, ended_at, outcome, error_code,
                               error_message)
SELECT s.pipeline_id, s.stage, a.number, s.stage || '@worker-' || (a.number + s.attempt) % 4,
       s.first_started_at + make_interval(secs => (a.number - 1) * 5),
       CASE WHEN a.number < s.attempt THEN s.first_started_at + make_interval(secs => (a.number - 1) * 5 + 3)
            WHEN s.status = 'RUNNING' THEN NULL
            WHEN s.status = 'RETRY_WAIT' THEN s.started_at + interval '3 seconds'
            ELSE s.finished_at END,
       CASE WHEN a.number < s.attempt OR s.status = 'RETRY_WAIT'
            THEN (ARRAY['failed_retryable', 'failed_retryable', 'interrupted'])[s.kind]
            WHEN s.status = 'SUCCEEDED' THEN 'succeeded'
            WHEN s.status = 'FAILED' THEN 'failed'
            WHEN s.status = 'CANCELED' THEN 'canceled' END,
       CASE WHEN a.number < s.attempt OR s.status = 'RETRY_WAIT'
            THEN (ARRAY['provider_error', 'rate_limited', 'worker_stopped'])[s.kind]
            ELSE s.last_error_code END,
       NULL
FROM (SELECT *, get_byte(decode(md5(pipeline_id::text), 'hex'), 2) % 3 + 1 AS kind FROM pipeline_stages) AS s
CROSS JOIN LATERAL generate_series(1, s.attempt) AS a (number)""",
    "dead_letters": """
INSERT INTO dead_letters (message_id, kind, service, queue, reason, headers, body, body_size, received_at, status)
SELECT 'bench-' || n, CASE WHEN n % 4 = 0 THEN 'parked' ELSE 'message' END, 'lyric', 'castad.lyric',
       'no handler for lyric.exploded', '{}', '\\x7b7d', 2, now() - make_interval(secs => n * 259.2),
       CASE WHEN n <= 50 THEN 'dead' WHEN n % 3 = 0 THEN 'discarded' ELSE 'replayed' END
FROM generate_series(1, :dead_letters) AS n""",
}
SEARCHES: tuple[tuple[str, str | uuid.UUID], ...] = (
    ("a pipeline id", uuid.UUID(hashlib.md5(b"500000").hexdigest())),  # pipeline n's id is md5(n)
    ("a whole name", "Cafe 5432"),
    ("digits", "5432"),
    ("a word", "cafe"),
    ("two Hangul syllables (a word's beginning)", "바다"),
    ("no match", "zzzz"),
)
SEARCHING_TENANTS = (None, "t0", "t3")


def _rows(conn: sa.Connection, statement: sa.Executable, values: dict[str, Any] | None = None) -> list[Any]:
    return list(conn.execute(statement, values))


def median_ms(run: Callable[[], Any], times: int) -> float:
    """The median of `times` runs, after one that warms the caches up."""
    run()
    taken = []
    for _ in range(times):
        started = time.perf_counter()
        run()
        taken.append((time.perf_counter() - started) * 1000)
    return statistics.median(taken)


def explain(conn: sa.Connection, sql: str, values: dict[str, Any]) -> str:
    rows = conn.execute(sa.text(f"EXPLAIN (ANALYZE, BUFFERS) {sql}"), values)
    return "\n".join(row[0] for row in rows)


def explain_statement(conn: sa.Connection, statement: sa.Select[Any]) -> tuple[str, dict[str, Any]]:
    compiled = statement.compile(dialect=conn.dialect)
    return str(compiled), dict(compiled.params)


def load(engine: sa.Engine, pipelines: int, dead_letters: int) -> dict[str, float]:
    seconds = {}
    for table, sql in LOAD.items():
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(sa.text("SET LOCAL synchronous_commit = off"))
            conn.execute(sa.text(sql), {"pipelines": pipelines, "dead_letters": dead_letters})
        seconds[table] = time.perf_counter() - started
        scratch.log.info("loaded %s in %.1f s", table, seconds[table])
    started = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM (ANALYZE)"))
    seconds["vacuum analyze"] = time.perf_counter() - started
    return seconds


def sizes(engine: sa.Engine) -> list[tuple[str, int, str, str]]:
    """(table, rows, table size, its indexes' size) of the tables read here."""
    with engine.connect() as conn:
        result = []
        for table in ("pipelines", "pipeline_stages", "pipeline_attempts", "dead_letters"):
            rows = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
            table_size, index_size = conn.execute(
                sa.text("SELECT pg_size_pretty(pg_table_size(:t)), pg_size_pretty(pg_indexes_size(:t))").bindparams(
                    t=table
                )
            ).one()
            result.append((table, rows, table_size, index_size))
        return result


def measure(engine: sa.Engine, repeat: int) -> dict[str, Any]:
    timings: dict[str, dict[str, float]] = {}
    plans: dict[str, str] = {}
    whole: dict[str, float] = {}
    for window in WINDOWS:
        window_s = stats.parse_window(window)
        with engine.connect() as conn:
            conn.execute(sa.text(f"SET work_mem = '{stats.WORK_MEM}'"))  # as stats.read has it
            values = stats.parameters(conn, window_s, STUCK_AFTER_S)
            for name, sql in stats.QUERIES.items():
                run = functools.partial(_rows, conn, sa.text(sql), values)
                timings.setdefault(name, {})[window] = median_ms(run, repeat)
                if window in EXPLAINED_WINDOWS and not (name in IN_FLIGHT_ONLY and window != EXPLAINED_WINDOWS[0]):
                    plans[name if name in IN_FLIGHT_ONLY else f"{name}, window {window}"] = explain(conn, sql, values)
        whole[window] = median_ms(functools.partial(stats.read, engine, window_s, STUCK_AFTER_S), repeat)
        scratch.log.info("window %s: /v1/stats reads in %.1f ms", window, whole[window])
    searches: list[tuple[str, str, int, float]] = []
    search_plans: dict[str, str] = {}
    with engine.connect() as conn:
        for label, term in SEARCHES:
            for tenant in SEARCHING_TENANTS:
                shown = listing.Listing(tenant=tenant, search=term)
                counted = listing.listing(shown, 10**7).subquery()
                matches = conn.execute(sa.select(sa.func.count()).select_from(counted)).scalar_one()
                search = functools.partial(listing.list_pipelines, conn, shown, 21)
                searches.append(
                    (f"{label}: {str(term)!r}", tenant or "(admin: all)", matches, median_ms(search, repeat))
                )
                ways = [("", None)] if isinstance(term, uuid.UUID) else [(", the newest first", RECENT), ("", None)]
                for way, within in ways:
                    sql, params = explain_statement(conn, listing.listing(shown, 21, within))
                    search_plans[f"{label}: {str(term)!r}, {tenant or 'admin'}{way}"] = "\n".join(
                        row[0] for row in conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
                    )
    return {"timings": timings, "plans": plans, "whole": whole, "searches": searches, "search_plans": search_plans}


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/stats.md.j2 from the measurements."""
    return pages.render("stats.md.j2", **measured)


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("stats", __doc__)
    parser.add_argument("--pipelines", type=int, default=1_000_000)
    parser.add_argument("--dead-letters", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each statement; the median is kept")
    args = parser.parse_args(argv)
    measured: dict[str, Any] | None = None
    if not args.render:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
        logging.getLogger("bench").setLevel(logging.INFO)
        url = scratch.database_url(f"castad_bench_stats_{scratch.RUN_ID}")
        cleanup = scratch.Cleanup()
        with scratch.interrupt_on_sigterm(), cleanup.scope():
            migrations.ensure_database(url)
            cleanup.push("drop the scratch database", lambda: migrations.drop_database(url))
            migrations.upgrade(url, API_MIGRATIONS)
            engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
            cleanup.push("close the engine", engine.dispose)
            loaded = load(engine, args.pipelines, args.dead_letters)
            tables = sizes(engine)
            result = measure(engine, args.repeat)
            facts = machine.facts()
        measured = {
            "facts": facts,
            "pipelines": args.pipelines,
            "dead_letters": args.dead_letters,
            "repeat": args.repeat,
            "windows": WINDOWS,
            "recent": RECENT,
            "loaded": loaded,
            "tables": tables,
            **result,
        }
    pages.write(args.output, render, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
