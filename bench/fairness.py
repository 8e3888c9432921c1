"""Waiting times per tenant behind another tenant's backlog, oldest first and by fair turns, and what a claim costs.

On a scratch stage database (the lyric service's migrations), jobs are claimed as a stage claims them
(castad_runtime.stage.repository.claiming.claim_next): oldest first (`fair=False`, as before) and by fair turns across
tenants (castad_runtime.stage.fair, now).

- **backlog**: a slow music API, driven as tests/integration/test_fair_turns.py drives it: its provider's quota
  lets `SLOTS` songs be at it at once, and a song takes `WORK_TURNS` turns there. A turn is one claim
  opportunity: songs that are done end, then one claim, whether or not the API has room. Tenant A submits
  `BACKLOG` briefs; at turn `ARRIVE_TURN`, long after A's songs filled the API, B submits 3 and C 1; turns go
  on until every song is done. Per tenant: the turns from a brief's submission to its song's start, and the
  turn its last song was done. At Suno's published rate of 20 calls per 10 s a turn is `TURN_S` seconds.
- **weights**: A of weight 1 and D of weight 3 each submit `WEIGHTED_BACKLOG` briefs to the same API; of the
  first `SHARED` songs started, each tenant's share.
- **claim cost**: 10,000 due jobs, of 10, 100 and 1,000 tenants (`SHAPES`); claims a round, each a transaction of
  its own on one connection, timed from its start to its commit, with no provider (the quota's part is the same
  either way: `make bench-quota`). The variants alternate over `ROUNDS` rounds.

Turns are counted, not timed, so the waits do not depend on this machine's speed. Written to
docs/reports/fairness.md by bench/templates/fairness.md.j2, the measurements kept beside it in fairness.json (`make
bench-fairness`; `python -m bench.fairness --render` writes the page again from them).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db
from castad_runtime.stage import machine, quota, repository
from castad_runtime.stage.repository import attempts, claiming
from castad_testkit import latency, scratch
from castad_testkit import machine as bench_machine

from bench import pages

SLOTS = 4  # the music API's songs at once: its provider's cap on jobs in flight
WORK_TURNS = 30  # turns a song takes at the API (15 s at TURN_S; an assumption, not Suno's figure)
TURN_S = 0.5  # Suno's published rate, 20 calls per 10 s: a claim opportunity every half second
BACKLOG = 200
ARRIVE_TURN = 20  # B and C submit after this turn: A's songs have had all SLOTS places since turn SLOTS
LATE = {"B": 3, "C": 1}
WEIGHTS = {"A": 1, "D": 3}
WEIGHTED_BACKLOG = 50  # each: more than either can claim of the first SHARED
SHARED = 40
MAX_TURNS = 20_000  # a run that has not ended by then is stuck: it stops with an error rather than run on
# Claim cost: tenants with due jobs, due jobs each, claims a variant makes a round (fewer where a claim is slow, so
# that the run stays short). 10,000 jobs due in each shape: only the number of tenants they belong to changes.
SHAPES = ((10, 1_000, 200), (100, 100, 200), (1_000, 10, 50))
ROUNDS = 3
VARIANTS = ("oldest", "fair")  # oldest first (before), fair turns (now)
PROVIDER = "music"
LEASE_S = 3600.0  # longer than any run: no lease runs out mid-song


class MusicApi:
    """The slow music API: one claim a turn through its quota, each song done WORK_TURNS turns after it started."""

    def __init__(self, engine: sa.Engine, fair: bool) -> None:
        self.engine, self.fair = engine, fair
        self.turn = 0
        self.tenant: dict[str, str] = {}  # pipeline -> its tenant
        self.submitted: dict[str, int] = {}  # pipeline -> the turn after which it was submitted
        self.started: dict[str, int] = {}
        self.finished: dict[str, int] = {}
        self.order: list[str] = []  # pipelines in the order their songs started
        self._working: dict[str, repository.Job] = {}

    def submit(self, tenant: str, count: int, weight: int = 1) -> None:
        share = events.Share(tenant=tenant, weight=weight)
        with db.transaction(self.engine) as conn:
            for number in range(count):
                pipeline_id = f"{tenant}-{number}"
                claiming.accept_trigger(conn, pipeline_id, {"brief": {}}, 1, 3, None, None, share)
                self.tenant[pipeline_id], self.submitted[pipeline_id] = tenant, self.turn

    def next_turn(self) -> None:
        self.turn += 1
        if self.turn > MAX_TURNS:
            raise RuntimeError(f"{MAX_TURNS:,} turns went by and songs are still waiting")
        for pipeline_id, job in list(self._working.items()):
            if self.turn - self.started[pipeline_id] >= WORK_TURNS:
                with db.transaction(self.engine) as conn:
                    if not attempts.finish_attempt(conn, job, machine.Status.SUCCEEDED, "succeeded", result={}):
                        raise RuntimeError(f"{pipeline_id}'s claim was lost mid-song")
                self.finished[pipeline_id] = self.turn
                del self._working[pipeline_id]
        with db.transaction(self.engine) as conn:
            claimed = claiming.claim_next(conn, "bench", LEASE_S, PROVIDER, fair=self.fair)
        if isinstance(claimed, repository.Job):
            self.started[claimed.pipeline_id] = self.turn
            self.order.append(claimed.pipeline_id)
            self._working[claimed.pipeline_id] = claimed
            if len(self._working) > SLOTS:  # the cap is the quota's to keep, not this driver's
                raise RuntimeError(f"the quota let {len(self._working)} songs at an API with room for {SLOTS}")

    def by_tenant(self) -> dict[str, dict[str, Any]]:
        """Each tenant's waits in turns (in the order its songs started) and the turn its last song was done."""
        got: dict[str, dict[str, Any]] = {}
        for pipeline_id in self.order:
            mine = got.setdefault(self.tenant[pipeline_id], {"waits": [], "last_done": 0})
            mine["waits"].append(self.started[pipeline_id] - self.submitted[pipeline_id])
            mine["last_done"] = max(mine["last_done"], self.finished.get(pipeline_id, 0))
        return got


def fresh(engine: sa.Engine) -> None:
    """No jobs, no tenant's place in the turns, and the music API's quota: only its cap holds claims back."""
    with db.transaction(engine) as conn:
        conn.execute(sa.text("TRUNCATE jobs, attempts, shares"))  # the in-flight count is zeroed by its trigger
        quota.configure(
            conn, quota.Limits(PROVIDER, max_rate_per_s=1e6, min_rate_per_s=1.0, burst=1e6, max_in_flight=SLOTS)
        )


def backlog(engine: sa.Engine, fair: bool) -> dict[str, Any]:
    fresh(engine)
    api = MusicApi(engine, fair)
    api.submit("A", BACKLOG)
    while api.turn < ARRIVE_TURN:
        api.next_turn()
    for tenant, count in LATE.items():
        api.submit(tenant, count)
    while len(api.finished) < len(api.submitted):
        api.next_turn()
    return {"turns": api.turn, "tenants": api.by_tenant()}


def weights(engine: sa.Engine, fair: bool) -> dict[str, int]:
    """Of the first SHARED songs started, how many were each tenant's."""
    fresh(engine)
    api = MusicApi(engine, fair)
    for tenant, weight in WEIGHTS.items():
        api.submit(tenant, WEIGHTED_BACKLOG, weight)
    while len(api.order) < SHARED:
        api.next_turn()
    return {tenant: sum(1 for p in api.order[:SHARED] if api.tenant[p] == tenant) for tenant in WEIGHTS}


def fill_due(engine: sa.Engine, tenants: int, each: int) -> None:
    """`tenants` × `each` jobs PENDING and due, their tenants taken in turn, each due a microsecond before the last."""
    with db.transaction(engine) as conn:
        conn.execute(sa.text("TRUNCATE jobs, attempts, shares"))
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, pipeline_id, status, max_attempts, due_at, input, tenant)"
                " SELECT gen_random_uuid(), 'p-' || n, 'PENDING', 3, now() - n * interval '1 microsecond',"
                " '{}'::jsonb, 't' || (n % :tenants) FROM generate_series(1, :jobs) AS n"
            ),
            {"tenants": tenants, "jobs": tenants * each},
        )
    vacuum(engine)


def reset(engine: sa.Engine) -> None:
    """The round's claims due again, their attempts gone, the dead rows they left vacuumed."""
    with db.transaction(engine) as conn:
        conn.execute(sa.text("DELETE FROM attempts"))
        conn.execute(
            sa.text(
                "UPDATE jobs SET status = 'PENDING', due_at = now(), lease_owner = NULL, lease_expires_at = NULL"
                " WHERE status = 'RUNNING'"
            )
        )
    vacuum(engine)


def vacuum(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("VACUUM ANALYZE jobs, shares"))


def claim_round(engine: sa.Engine, fair: bool, claims: int) -> list[float]:
    """`claims` claims, each a transaction of its own on the engine's one connection: ms each, start to commit."""
    took = []
    for _ in range(claims):
        started = time.perf_counter()
        with db.transaction(engine) as conn:
            job = claiming.claim_next(conn, "bench", LEASE_S, fair=fair)
        took.append(time.perf_counter() - started)
        if not isinstance(job, repository.Job):
            raise RuntimeError("a claim found nothing, though jobs are due")
    return latency.ms(took)


def claim_cost(engine: sa.Engine) -> list[dict[str, Any]]:
    shapes = []
    for tenants, each, claims in SHAPES:
        fill_due(engine, tenants, each)
        rounds: dict[str, list[dict[str, float]]] = {variant: [] for variant in VARIANTS}
        for number in range(ROUNDS):
            for variant in VARIANTS if number % 2 == 0 else VARIANTS[::-1]:
                took = claim_round(engine, variant == "fair", claims)
                rounds[variant].append({"p50": latency.percentile(took, 50), "p95": latency.percentile(took, 95)})
                reset(engine)
                print(
                    f"{tenants:,} tenants, round {number + 1}, {variant}: {rounds[variant][-1]['p50']:.2f} ms a claim"
                )
        shapes.append({"tenants": tenants, "each": each, "claims": claims, "rounds": rounds})
    return shapes


def run(cleanup: scratch.Cleanup) -> dict[str, Any]:
    runs, shared = {}, {}
    with cleanup.scope():
        engine = scratch.stage_database(cleanup, f"castad_bench_{scratch.RUN_ID}_fairness", pool_size=1)
        for variant in VARIANTS:
            runs[variant] = backlog(engine, fair=variant == "fair")
            shared[variant] = weights(engine, fair=variant == "fair")
            print(
                f"{variant}: the backlog through in {runs[variant]['turns']:,} turns; first {SHARED}: {shared[variant]}"
            )
        cost = claim_cost(engine)
    return {
        "slots": SLOTS,
        "work_turns": WORK_TURNS,
        "turn_s": TURN_S,
        "backlog": {"jobs": BACKLOG, "arrive_turn": ARRIVE_TURN, "late": LATE, "runs": runs},
        "weights": {"weights": WEIGHTS, "jobs": WEIGHTED_BACKLOG, "first": SHARED, "runs": shared},
        "claim_cost": {"rounds": ROUNDS, "shapes": cost},
    }


def summary(waits: Sequence[float]) -> dict[str, float]:
    """p50, p95 and max of waits (linear between ranks, as latency.percentile)."""
    return {"p50": latency.percentile(waits, 50), "p95": latency.percentile(waits, 95), "max": max(waits)}


def shares(counts: Mapping[str, int]) -> dict[str, float]:
    """Each tenant's part of the songs counted."""
    total = sum(counts.values())
    return {tenant: count / total for tenant, count in counts.items()}


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/fairness.md.j2 from the measurements and what they come to."""
    queue, weighted, cost = measured["backlog"], measured["weights"], measured["claim_cost"]
    runs = queue["runs"]
    tenants = sorted({tenant for got in runs.values() for tenant in got["tenants"]})

    def median_round(shape: dict[str, Any], quantile: str) -> dict[str, float]:
        return {variant: statistics.median(r[quantile] for r in shape["rounds"][variant]) for variant in VARIANTS}

    return pages.render(
        "fairness.md.j2",
        facts=measured["facts"],
        turn_s=measured["turn_s"],
        slots=measured["slots"],
        work=measured["work_turns"],
        queue=queue,
        weighted=weighted,
        cost=cost,
        variants=VARIANTS,
        waits={
            tenant: {variant: summary(runs[variant]["tenants"][tenant]["waits"]) for variant in VARIANTS}
            for tenant in tenants
        },
        worst={
            variant: max(max(runs[variant]["tenants"][tenant]["waits"]) for tenant in queue["late"])
            for variant in VARIANTS
        },
        shares={variant: shares(weighted["runs"][variant]) for variant in VARIANTS},
        claims=[{"p50": median_round(shape, "p50"), "p95": median_round(shape, "p95")} for shape in cost["shapes"]],
        due=sorted({shape["tenants"] * shape["each"] for shape in cost["shapes"]}),
    )


def measure() -> dict[str, Any]:
    """Run the rounds of both claims and return the measurements the page is written from, with the machine's."""
    load = bench_machine.load()
    cleanup = scratch.Cleanup()
    with scratch.interrupt_on_sigterm():
        measured = run(cleanup)
    return {**measured, "facts": bench_machine.brief_facts(load)}


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("fairness", __doc__)
    args = parser.parse_args(argv)
    pages.write(args.output, render, None if args.render else measure())
    return 0


if __name__ == "__main__":
    sys.exit(main())
