"""The operator's numbers over a window, from the gateway's own projection.

Every SQL statement of them and their arithmetic.

Each statement reads through an index whose size follows the window or the set of pipelines in flight,
never the whole history (`QUERIES`; bench/stats.py times them on a million pipelines and records their
plans in docs/reports/stats.md):

- what is in flight now: the partial index pipelines_in_flight, then each in-flight pipeline's stages by
  their primary key;
- what ended in the window: pipelines_ended (retention's too), pipeline_stages_finished,
  pipeline_attempts_ended (the last covers every column it is read for);
- what was created in the window: pipelines_listing; dead letters: dead_letters_open, dead_letters_received.

The gateway does not see leases: an attempt counts as stuck when its stage is RUNNING and it started
longer ago than `stuck_after_s` (the longest an attempt may run, plus a lease).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from castad_contracts import api, events

from castad_api import errors, model, reviews, tables

MIN_WINDOW_S = 60
MAX_WINDOW_S = 7 * 86_400
MAX_BUCKETS = 240  # of the throughput series: whole minutes each, as few as make at most this many
STUCK_SHOWN = 20
PERCENTILES = (0.5, 0.95, 0.99)
_WINDOW = re.compile(r"^([0-9]{1,9})([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_window(text: str) -> int:
    """Seconds of a window written as `15m`, `1h`, `24h`, `7d` or a number of seconds (`900`, `900s`)."""
    found = _WINDOW.match(text.strip())
    if found is None:
        raise errors.BadWindow("must be a number of seconds, or of minutes, hours or days: 900, 15m, 1h, 7d")
    seconds = int(found.group(1)) * _UNIT_S[found.group(2)]
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise errors.BadWindow(f"must be from {MIN_WINDOW_S} s to {MAX_WINDOW_S // 86_400} days")
    return seconds


def bucket_seconds(window_s: int) -> int:
    """The length of a throughput bucket: whole minutes, as few as keep the window in MAX_BUCKETS."""
    return 60 * max(1, math.ceil(window_s / 60 / MAX_BUCKETS))


def rate(part: int, whole: int) -> float | None:
    """part / whole; None when there is no whole to speak of."""
    return part / whole if whole else None


def per_minute(count: int, window_s: int) -> float:
    return count / (window_s / 60)


IN_FLIGHT = f"SELECT id FROM pipelines WHERE status NOT IN {tables.OPEN_ENDED}"
STAGE_ORDER = ", ".join(f"('{stage.value}', {position})" for position, stage in enumerate(events.STAGE_ORDER, 1))
# Where each in-flight pipeline is: its first stage that has not succeeded (PENDING if not started yet), found
# through the stages' primary key for each of them (LATERAL: never a scan of every pipeline's stages).
PLACES = f"""
WITH places AS (
    SELECT flight.id, here.stage, here.status, here.attempt, here.started_at
    FROM ({IN_FLIGHT}) AS flight
    CROSS JOIN LATERAL (
        SELECT stage_order.stage, coalesce(s.status, 'PENDING') AS status, s.attempt, s.started_at
        FROM (VALUES {STAGE_ORDER}) AS stage_order (stage, position)
        LEFT JOIN pipeline_stages s ON s.pipeline_id = flight.id AND s.stage = stage_order.stage
        WHERE coalesce(s.status, 'PENDING') <> 'SUCCEEDED'
        ORDER BY stage_order.position
        LIMIT 1
    ) AS here
)"""
_PERCENTILES = f"percentile_cont(ARRAY{list(PERCENTILES)}) WITHIN GROUP"

# Every statement, by name, with the parameters it takes: since (the window's start), window_s,
# bucket_s, stuck_before. bench/stats.py explains each one.
QUERIES: dict[str, str] = {
    "in_flight": f"SELECT status, count(*) AS n FROM pipelines WHERE status NOT IN {tables.OPEN_ENDED} GROUP BY status",
    "places": f"""{PLACES}
SELECT stage, status, count(*) AS n,
       count(*) FILTER (WHERE status = 'RUNNING' AND started_at < :stuck_before) AS stuck
FROM places GROUP BY stage, status""",
    "stuck": f"""{PLACES}
SELECT places.id AS pipeline_id, places.stage, places.attempt, a.worker, places.started_at
FROM places
LEFT JOIN pipeline_attempts a
    ON a.pipeline_id = places.id AND a.stage = places.stage AND a.attempt = places.attempt
WHERE places.status = 'RUNNING' AND places.started_at < :stuck_before
ORDER BY places.started_at LIMIT {STUCK_SHOWN}""",
    "created": """
SELECT date_bin(make_interval(secs => :bucket_s), created_at, :since) AS bucket, count(*) AS n
FROM pipelines WHERE created_at >= :since GROUP BY bucket""",
    "finished": f"""
SELECT date_bin(make_interval(secs => :bucket_s), finished_at, :since) AS bucket, status, count(*) AS n
FROM pipelines WHERE {tables.ENDED} AND finished_at >= :since GROUP BY bucket, status""",
    "stage_runs": f"""
SELECT stage,
       count(*) FILTER (WHERE status = 'SUCCEEDED') AS succeeded,
       count(*) FILTER (WHERE status = 'FAILED') AS failed,
       count(*) FILTER (WHERE status = 'CANCELED') AS canceled,
       count(*) FILTER (WHERE status = 'SUCCEEDED' AND first_started_at IS NOT NULL) AS timed,
       {_PERCENTILES} (ORDER BY extract(epoch FROM finished_at - first_started_at))
           FILTER (WHERE status = 'SUCCEEDED' AND first_started_at IS NOT NULL) AS duration
FROM pipeline_stages WHERE finished_at >= :since GROUP BY stage""",
    "attempt_ends": """
SELECT stage, outcome, error_code, count(*) AS n
FROM pipeline_attempts WHERE ended_at >= :since GROUP BY stage, outcome, error_code""",
    "attempt_durations": f"""
SELECT stage, count(*) AS timed, {_PERCENTILES} (ORDER BY extract(epoch FROM ended_at - started_at)) AS duration
FROM pipeline_attempts WHERE ended_at >= :since AND started_at IS NOT NULL GROUP BY stage""",
    # Drafts waiting for a decision: how many, and the oldest.
    "reviews_waiting": f"SELECT count(*) AS n {reviews.WAITING}",
    "reviews_oldest": f"""
SELECT r.pipeline_id, r.drafted_at, r.review_until {reviews.WAITING} ORDER BY r.drafted_at LIMIT {STUCK_SHOWN}""",
    "dead_letters_open": "SELECT kind, count(*) AS n FROM dead_letters WHERE status = 'dead' GROUP BY kind",
    "dead_letters_received": """
SELECT kind, status, count(*) AS n FROM dead_letters WHERE received_at >= :since GROUP BY kind, status""",
}


def parameters(conn: sa.Connection, window_s: int, stuck_after_s: float) -> dict[str, Any]:
    """The values the statements take, from the database's clock (one transaction: one `now()`)."""
    at, since, stuck_before = conn.execute(
        sa.text("SELECT now(), now() - make_interval(secs => :window_s), now() - make_interval(secs => :stuck_s)"),
        {"window_s": window_s, "stuck_s": stuck_after_s},
    ).one()
    return {
        "at": at,
        "since": since,
        "window_s": window_s,
        "bucket_s": bucket_seconds(window_s),
        "stuck_before": stuck_before,
    }


WORK_MEM = "64MB"  # sorts of a week's durations stay in memory (PostgreSQL's default, 4MB, spills to disk)


def read(engine: sa.Engine, window_s: int, stuck_after_s: float) -> api.Stats:
    """Every number, read in one repeatable-read transaction so that they agree with each other."""
    with engine.connect().execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True) as conn:
        conn.execute(sa.text(f"SET LOCAL work_mem = '{WORK_MEM}'"))
        values = parameters(conn, window_s, stuck_after_s)
        rows = {name: list(conn.execute(sa.text(sql), values)) for name, sql in QUERIES.items()}
    return assemble(rows, values, stuck_after_s)


def assemble(rows: dict[str, list[Any]], values: dict[str, Any], stuck_after_s: float) -> api.Stats:
    at: dt.datetime = values["at"]
    window_s: int = values["window_s"]
    in_flight = {row.status: row.n for row in rows["in_flight"]}
    finished: dict[str, int] = defaultdict(int)
    for row in rows["finished"]:
        finished[row.status] += row.n
    created = sum(row.n for row in rows["created"])
    return api.Stats(
        at=at,
        window_s=window_s,
        since=values["since"],
        stuck_after_s=stuck_after_s,
        pipelines=api.PipelineCounts(
            in_flight=sum(in_flight.values()),
            in_flight_by_status=in_flight,
            created=created,
            finished=dict(finished),
        ),
        stages=_stages(rows),
        stuck=[
            api.StuckAttempt(
                pipeline_id=str(row.pipeline_id),
                stage=row.stage,
                attempt=row.attempt,
                worker=row.worker,
                started_at=row.started_at,
                running_s=(at - row.started_at).total_seconds(),
            )
            for row in rows["stuck"]
        ],
        reviews=api.ReviewCounts(
            waiting=rows["reviews_waiting"][0].n,
            oldest=[
                api.WaitingReview(
                    pipeline_id=str(row.pipeline_id),
                    drafted_at=row.drafted_at,
                    waiting_s=(at - row.drafted_at).total_seconds(),
                    review_until=row.review_until,
                )
                for row in rows["reviews_oldest"]
            ],
        ),
        dead_letters=_dead_letters(rows),
        throughput=_throughput(rows, values, created, finished),
    )


def _stages(rows: dict[str, list[Any]]) -> list[api.StageStats]:
    places: dict[tuple[str, str], Any] = {(row.stage, row.status): row for row in rows["places"]}
    runs = {row.stage: row for row in rows["stage_runs"]}
    durations = {row.stage: row for row in rows["attempt_durations"]}
    ends: dict[str, list[Any]] = defaultdict(list)
    for row in rows["attempt_ends"]:
        ends[row.stage].append(row)
    result = []
    for stage in events.STAGE_ORDER:
        waiting = (model.StageStatus.PENDING, model.StageStatus.RUNNING, model.StageStatus.RETRY_WAIT)
        pending, running, retry_waiting = (places.get((stage.value, status.value)) for status in waiting)
        run = runs.get(stage.value)
        succeeded, failed = (run.succeeded, run.failed) if run is not None else (0, 0)
        attempts = sum(row.n for row in ends[stage.value])
        outcomes: dict[str, int] = defaultdict(int)
        by_code: dict[str, int] = defaultdict(int)
        for row in ends[stage.value]:
            outcomes[row.outcome] += row.n
            if row.error_code is not None:
                by_code[row.error_code] += row.n
        timed = durations.get(stage.value)
        result.append(
            api.StageStats(
                stage=stage,
                pending=pending.n if pending is not None else 0,
                running=running.n if running is not None else 0,
                retry_waiting=retry_waiting.n if retry_waiting is not None else 0,
                stuck=running.stuck if running is not None else 0,
                succeeded=succeeded,
                failed=failed,
                canceled=run.canceled if run is not None else 0,
                failure_rate=rate(failed, succeeded + failed),
                duration_s=_percentiles(run.timed, run.duration) if run is not None else None,
                attempts=attempts,
                attempt_outcomes=dict(outcomes),
                attempt_duration_s=_percentiles(timed.timed, timed.duration) if timed is not None else None,
                errors=[
                    api.ErrorCount(code=code, count=n, rate=n / attempts)
                    for code, n in sorted(by_code.items(), key=lambda item: (-item[1], item[0]))
                ],
            )
        )
    return result


def _percentiles(count: int, values: list[float] | None) -> api.Percentiles | None:
    if not count or values is None:
        return None
    p50, p95, p99 = values
    return api.Percentiles(count=count, p50=p50, p95=p95, p99=p99)


def _dead_letters(rows: dict[str, list[Any]]) -> api.DeadLetterCounts:
    received: dict[str, dict[str, int]] = defaultdict(dict)
    for row in rows["dead_letters_received"]:
        received[row.kind][row.status] = row.n
    return api.DeadLetterCounts(open={row.kind: row.n for row in rows["dead_letters_open"]}, received=dict(received))


def _throughput(
    rows: dict[str, list[Any]], values: dict[str, Any], created: int, finished: dict[str, int]
) -> api.Throughput:
    since: dt.datetime = values["since"]
    window_s: int = values["window_s"]
    bucket_s: int = values["bucket_s"]
    starts = [since + dt.timedelta(seconds=n * bucket_s) for n in range(math.ceil(window_s / bucket_s))]
    counts: dict[dt.datetime, dict[str, int]] = {start: defaultdict(int) for start in starts}
    last = counts[starts[-1]]  # what happened at the very end of the window starts a bucket of its own: this one
    for row in rows["created"]:
        counts.get(row.bucket, last)["created"] += row.n
    for row in rows["finished"]:
        counts.get(row.bucket, last)[row.status.lower()] += row.n
    outcomes = ("succeeded", "failed", "canceled")
    return api.Throughput(
        per_minute={
            "created": per_minute(created, window_s),
            **{name: per_minute(finished.get(name.upper(), 0), window_s) for name in outcomes},
        },
        bucket_s=bucket_s,
        buckets=[
            api.ThroughputBucket(start=start, **{name: counts[start][name] for name in ("created", *outcomes)})
            for start in starts
        ],
    )
