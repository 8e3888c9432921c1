"""Claims a second through a provider's quota at 32 claimers, with a cap on jobs in flight and 10,000 in flight.

`CLAIMERS` threads, each with its own pooled connection, claim jobs of one provider on a scratch stage
database (the lyric service's migrations), each claim a transaction of its own, until each made `PER_CLAIMER`:

- `one_row`: the quota before issue 37, kept here only as this baseline: every claim locks the provider's
  one row, counts the jobs RUNNING or AWAITING under that lock, and writes the row (the in-flight triggers
  disabled, as that schema had none);
- `sharded`: castad_runtime.stage.quota now: a token from a shard of the bucket no other claim holds,
  a row of the in-flight count below its share of the cap, the count kept by the triggers.

`IN_FLIGHT` jobs wait AWAITING, not due, the whole time; claimed jobs stay RUNNING until the round ends,
when they are made due again. The rate and the cap are far above what is claimed, so that what is measured
is what a claim costs, not the quota's refusals. The variants alternate over `ROUNDS` rounds. Written to
docs/reports/quota.md by bench/templates/quota.md.j2, the measurements kept beside it in quota.json (`make
bench-quota`; `--render` writes the page again from them).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import sqlalchemy as sa
from castad_runtime import db
from castad_runtime.stage import quota, repository
from castad_runtime.stage.repository import claiming
from castad_testkit import latency, machine, scratch

from bench import pages

CLAIMERS = 32
PER_CLAIMER = 20  # claims per claimer and round
ROUNDS = 3
IN_FLIGHT = 10_000
CAP = 1_000_000
DUE = CLAIMERS * PER_CLAIMER  # jobs due at each round's start: one for every claim
PROVIDER = "bench"
MAX_MISSED = 10 * PER_CLAIMER  # claims of a claimer that found nothing, at most
VARIANTS = ("one_row", "sharded")

# The gate and its spend before issue 37, on the columns the provider's row still has for services of then.
ONE_ROW_GATE = """
SELECT least(burst, tokens + rate_per_s * extract(epoch FROM now() - refilled_at)) AS tokens,
    coalesce(blocked_until > now(), false) AS blocked, max_in_flight
FROM quotas WHERE provider = %(provider)s FOR UPDATE
"""
ONE_ROW_IN_FLIGHT = "SELECT count(*) FROM jobs WHERE status IN ('RUNNING', 'AWAITING')"
ONE_ROW_SPEND = """
UPDATE quotas SET tokens = least(burst, tokens + rate_per_s * extract(epoch FROM now() - refilled_at)) - 1,
    refilled_at = now()
WHERE provider = %(provider)s
"""


def one_row_claim(conn: sa.Connection, worker: str) -> bool:
    """A claim through the quota as it was: gate under the row's lock, the claim, the spend."""
    gate = db.run(conn, ONE_ROW_GATE, {"provider": PROVIDER}).fetchone()
    assert gate is not None  # the provider's row, made by the set-up
    if gate.blocked or gate.tokens < 1:
        return False
    counted = db.run(conn, ONE_ROW_IN_FLIGHT).fetchone()
    assert counted is not None  # count(*) returns a row
    in_flight = counted[0]
    statement = claiming.CLAIM_OLDEST if in_flight < gate.max_in_flight else claiming.CLAIM_POLL_OLDEST
    row = db.run(conn, statement, {"worker": worker, "lease_s": 300.0, "reads": claiming.READS_ANY}).fetchone()
    if row is None:
        return False
    db.run(conn, claiming.OPEN_ATTEMPT, (row.id, row.attempts, worker))
    db.run(conn, ONE_ROW_SPEND, {"provider": PROVIDER})
    return True


def sharded_claim(conn: sa.Connection, worker: str) -> bool:
    return isinstance(claiming.claim_next(conn, worker, 300.0, PROVIDER), repository.Job)


CLAIMS = {"one_row": one_row_claim, "sharded": sharded_claim}


def prepare(engine: sa.Engine) -> None:
    """The provider, `IN_FLIGHT` jobs AWAITING and not due, `DUE` jobs PENDING and due."""
    with db.transaction(engine) as conn:
        quota.configure(
            conn,
            quota.Limits(PROVIDER, max_rate_per_s=1e6, min_rate_per_s=1.0, burst=1e6, max_in_flight=CAP),
        )
        for status, count, due in (("AWAITING", IN_FLIGHT, "now() + interval '1 day'"), ("PENDING", DUE, "now()")):
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (id, pipeline_id, status, max_attempts, due_at, input, handle)"
                    f" SELECT gen_random_uuid(), gen_random_uuid()::text, '{status}', 1000, {due} - n * interval"
                    " '1 microsecond', '{}'::jsonb, CASE WHEN :status = 'AWAITING' THEN 'work' END"
                    " FROM generate_series(1, :count) AS n"
                ),
                {"status": status, "count": count},
            )
        conn.execute(sa.text("ANALYZE jobs"))


def reset(engine: sa.Engine, variant: str) -> None:
    """The round's claims due again, their attempts gone; the in-flight triggers on for `sharded` only (their
    count made anew from the jobs when they come back on)."""
    with db.transaction(engine) as conn:
        conn.execute(sa.text("ALTER TABLE jobs ENABLE TRIGGER USER"))
        conn.execute(sa.text("DELETE FROM attempts"))
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = 'PENDING', due_at = now(), lease_owner = NULL, lease_expires_at = NULL"
                " WHERE status = 'RUNNING'"
            )
        )
        conn.execute(
            sa.text(
                "UPDATE in_flight_counts SET jobs = CASE WHEN shard = 0 THEN"
                " (SELECT count(*) FROM jobs WHERE status IN ('RUNNING', 'AWAITING')) ELSE 0 END"
            )
        )
        quota.configure(
            conn,
            quota.Limits(PROVIDER, max_rate_per_s=1e6, min_rate_per_s=1.0, burst=1e6, max_in_flight=CAP),
        )
        if variant == "one_row":
            conn.execute(sa.text("ALTER TABLE jobs DISABLE TRIGGER USER"))
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("VACUUM ANALYZE jobs"))


def one_round(engine: sa.Engine, variant: str) -> dict[str, Any]:
    claim = CLAIMS[variant]
    barrier = threading.Barrier(CLAIMERS + 1)
    latencies: list[list[float]] = [[] for _ in range(CLAIMERS)]
    errors: list[BaseException] = []
    missed = [0] * CLAIMERS

    def claimer(index: int) -> None:
        mine = latencies[index]
        barrier.wait()
        try:
            while len(mine) < PER_CLAIMER:
                started = time.perf_counter()
                with db.transaction(engine) as conn:
                    claimed = claim(conn, f"claimer-{index}")
                if claimed:
                    mine.append(time.perf_counter() - started)
                else:  # the job it went for was claimed by another meanwhile: as a scheduler's slot, look again
                    missed[index] += 1
                    if missed[index] > MAX_MISSED:
                        raise RuntimeError(f"{variant}: {MAX_MISSED} claims found nothing, though jobs are due")
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=claimer, args=(i,), name=f"claimer-{i}") for i in range(CLAIMERS)]
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
    with engine.connect() as conn:
        real = conn.execute(sa.text("SELECT count(*) FROM jobs WHERE status IN ('RUNNING', 'AWAITING')")).scalar_one()
        counted = quota.jobs_in_flight(conn)
    if variant == "sharded" and counted != real:
        raise RuntimeError(f"the triggers counted {counted} jobs in flight, the jobs table holds {real}")
    return {
        "rate": len(flat) / elapsed,
        "missed": sum(missed),
        "latency_ms": latency.summary(latency.ms(flat)),
        "in_flight": real,
    }


def run(cleanup: scratch.Cleanup) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    with cleanup.scope():
        engine = scratch.stage_database(cleanup, f"castad_bench_{scratch.RUN_ID}_quota", pool_size=CLAIMERS)
        prepare(engine)
        for number in range(ROUNDS):
            order = VARIANTS if number % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                reset(engine, variant)
                results[variant].append(one_round(engine, variant))
                print(f"round {number + 1} {variant}: {results[variant][-1]['rate']:,.0f} claims/s", flush=True)
    return results


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/quota.md.j2 from the measurements and each variant's medians."""
    medians = {
        variant: {
            "rate": statistics.median(r["rate"] for r in rounds),
            "p50": statistics.median(r["latency_ms"]["p50"] for r in rounds),
            "p99": statistics.median(r["latency_ms"]["p99"] for r in rounds),
            "missed": sum(r["missed"] for r in rounds),
        }
        for variant, rounds in measured["rounds"].items()
    }
    return pages.render("quota.md.j2", **measured, medians=medians)


def measure() -> dict[str, Any]:
    """Run the rounds of both quotas and return the measurements the page is written from."""
    load = machine.load()
    cleanup = scratch.Cleanup()
    with scratch.interrupt_on_sigterm():
        rounds = run(cleanup)
    return {
        "facts": machine.brief_facts(load),
        "claimers": CLAIMERS,
        "per_claimer": PER_CLAIMER,
        "round_count": ROUNDS,
        "in_flight": IN_FLIGHT,
        "cap": CAP,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("quota", __doc__)
    args = parser.parse_args(argv)
    pages.write(args.output, render, None if args.render else measure())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
