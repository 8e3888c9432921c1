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
docs/reports/fairness.md, the measurements kept beside it in fairness.json (`make bench-fairness`;
`python -m bench.fairness --render` writes the page again from them).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db
from castad_runtime.stage import machine, quota, repository
from castad_runtime.stage.repository import attempts, claiming
from castad_testkit import latency, scratch
from castad_testkit import machine as bench_machine

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
VARIANTS = ("oldest", "fair")
LABELS = {"oldest": "oldest first (before)", "fair": "fair turns (now)"}
PROVIDER = "music"
LEASE_S = 3600.0  # longer than any run: no lease runs out mid-song
OUT = scratch.REPORTS / "fairness.md"


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
            job = claiming.claim_next(conn, "bench", LEASE_S, PROVIDER, fair=self.fair)
        if isinstance(job, repository.Job):
            self.started[job.pipeline_id] = self.turn
            self.order.append(job.pipeline_id)
            self._working[job.pipeline_id] = job
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


def said(numbers: Iterable[int]) -> str:
    """Numbers as prose lists them: "10, 100 or 1,000"."""
    written = [f"{number:,}" for number in numbers]
    return " or ".join(filter(None, (", ".join(written[:-1]), written[-1])))


def minutes(turns: float, turn_s: float) -> str:
    return f"{turns * turn_s / 60:,.1f} min"


def render(measured: dict[str, Any]) -> str:
    facts, turn_s, slots, work = measured["facts"], measured["turn_s"], measured["slots"], measured["work_turns"]
    queue, weighted, cost = measured["backlog"], measured["weights"], measured["claim_cost"]
    runs = queue["runs"]
    tenants = sorted({tenant for got in runs.values() for tenant in got["tenants"]})
    wait_rows = []
    for tenant in tenants:
        for variant in VARIANTS:
            got = runs[variant]["tenants"][tenant]
            turns = summary(got["waits"])
            wait_rows.append(
                f"| {tenant} | {LABELS[variant]} | {len(got['waits']):,}"
                f" | {turns['p50']:,.1f} / {turns['p95']:,.1f} / {turns['max']:,.0f}"
                f" | {turns['p50'] * turn_s:,.1f} / {turns['p95'] * turn_s:,.1f} / {turns['max'] * turn_s:,.1f}"
                f" | {got['last_done']:,} ({minutes(got['last_done'], turn_s)}) |"
            )
    late = queue["late"]
    late_said = " and ".join(f"{tenant} submits {count}" for tenant, count in late.items())
    worst = {variant: max(max(runs[variant]["tenants"][tenant]["waits"]) for tenant in late) for variant in VARIANTS}
    a_done = {variant: runs[variant]["tenants"]["A"]["last_done"] for variant in VARIANTS}
    share_rows = []
    for variant in VARIANTS:
        counts = weighted["runs"][variant]
        parts = shares(counts)
        share_rows.append(
            f"| {LABELS[variant]} | "
            + " | ".join(f"{counts[tenant]} ({parts[tenant]:.0%})" for tenant in weighted["weights"])
            + " |"
        )
    cost_rows = []
    for shape in cost["shapes"]:
        p50 = {variant: statistics.median(r["p50"] for r in shape["rounds"][variant]) for variant in VARIANTS}
        for variant in VARIANTS:
            rounds = shape["rounds"][variant]
            p95 = statistics.median(r["p95"] for r in rounds)
            per_round = ", ".join(f"{r['p50']:.2f}" for r in rounds)
            cost_rows.append(
                f"| {shape['tenants']:,} × {shape['each']:,} | {LABELS[variant]} | {p50[variant]:.2f} / {p95:.2f}"
                f" | {per_round} | {p50[variant] / p50['oldest']:.2f}x |"
            )
    due = {shape["tenants"] * shape["each"] for shape in cost["shapes"]}
    return "\n".join(
        [
            "# Fair turns across tenants: waiting times, and what a claim costs",
            "",
            "Generated by `make bench-fairness` (`python -m bench.fairness`) from the measurements kept beside it",
            "in fairness.json; `python -m bench.fairness --render` writes it again from them.",
            "",
            "Jobs are claimed on a scratch stage database as a stage claims them (`repository.claiming.claim_next`):",
            "oldest first, as before fair turns (`fair=False`), and by fair turns across tenants, now",
            "([how the turn is chosen](../operating/fairness.md)).",
            "",
            f"Run {facts['date']} on {facts['cores']} cores, {facts['cpu']}; {facts['postgres']};",
            f"load average at the start {facts['load']}.",
            "",
            "## A backlog, and the few briefs behind it",
            "",
            "A slow music API, driven as `tests/integration/test_fair_turns.py` drives it: its provider's quota",
            f"lets {slots} songs be at it at once, and a song takes {work} turns there. A turn is one claim",
            "opportunity: the songs that are done end, then one claim through the quota, whether or not the API",
            "has room (the quota's rate is far above the turns, so only its cap holds claims back). Tenant A",
            f"submits {queue['jobs']} briefs; after turn {queue['arrive_turn']}, when A's songs have long had"
            " every place at the API,",
            f"{late_said}; the turns go on until every song is done. A brief's wait runs from its submission",
            "to the turn its song started: a wait of 1 is the first claim after it was submitted.",
            "",
            "The seconds are the turns at Suno's published rate of 20 calls per 10 s, a claim opportunity",
            f"every {turn_s:g} s. A song then takes {work * turn_s:g} s at the API: that is an assumption, not a"
            " figure of",
            "Suno's, and the waits behind a backlog grow with it. Turns are counted, not timed: these waits",
            "do not depend on this machine.",
            "",
            "| tenant | order | briefs | wait, turns (p50 / p95 / max) | wait, s (p50 / p95 / max) |"
            " last song done, turn |",
            "|---|---|---:|---|---|---:|",
            *wait_rows,
            "",
            "Oldest first, the late tenants' briefs wait for the whole of A's backlog: up to"
            f" {worst['oldest']:,} turns",
            f"({minutes(worst['oldest'], turn_s)}). With fair turns they wait at most {worst['fair']:,} turns"
            f" ({worst['fair'] * turn_s:,.1f} s): for a place",
            f"at the API to come free (a song there takes {work} turns), then for a turn or two of A's. A's own",
            f"backlog is through at turn {a_done['fair']:,} with fair turns and {a_done['oldest']:,} oldest first:"
            " the API does the",
            "same work either way, in another order.",
            "",
            "## Weights",
            "",
            " and ".join(f"{tenant} of weight {weight}" for tenant, weight in weighted["weights"].items())
            + f" each submit {weighted['jobs']} briefs to the same API,",
            f"in that order. Of the first {weighted['first']} songs started (the first {weighted['first']} claims"
            " that took a job),",
            "each tenant's:",
            "",
            "| order | " + " | ".join(f"{t} (weight {w})" for t, w in weighted["weights"].items()) + " |",
            "|---|" + "---:|" * len(weighted["weights"]),
            *share_rows,
            "",
            "## What a claim costs",
            "",
            f"{said(sorted(due))} jobs due, of {said(shape['tenants'] for shape in cost['shapes'])} tenants (their"
            " tenants",
            "taken in turn, so each tenant's oldest job is near the front). Claims on one connection, each a",
            "transaction of its own timed from its start to its commit, with no provider: the quota's part of a",
            f"claim is the same either way ([its report](quota.md)). The variants alternate over {cost['rounds']}"
            " rounds; the",
            "claims of a round stay RUNNING until it ends, when they are made due again and the table is",
            "vacuumed. Claims a round: "
            + ", ".join(
                f"{shape['claims']} of each variant at {shape['tenants']:,} tenants" for shape in cost["shapes"]
            )
            + ".",
            "",
            "| tenants × due jobs each | order | ms a claim, p50 / p95 (median round) | p50 per round |"
            " of oldest first |",
            "|---|---|---|---|---:|",
            *cost_rows,
            "",
            "A fair claim finds the tenants with due jobs by a loose scan of an index, one probe a tenant: what",
            "it costs grows with the tenants that have jobs due (about 20 µs a tenant here), where an",
            "oldest-first claim reads the front of one index whatever their number. At 1,000 tenants waiting at",
            "once a claim costs about 20 ms of the database; a set of waiting tenants kept by triggers, as the",
            "jobs in flight are counted, would make it cheaper, and is not built. This process and PostgreSQL",
            "share the machine's cores with whatever else runs at the time: the load average says how busy it was.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__)
    parser.add_argument("--render", action="store_true", help="write the page again from fairness.json, run nothing")
    parser.add_argument("--output", type=pathlib.Path, default=OUT)
    args = parser.parse_args(argv)
    kept = args.output.with_suffix(".json")
    if not args.render:
        load = bench_machine.load()
        cleanup = scratch.Cleanup()
        with scratch.interrupt_on_sigterm():
            measured = run(cleanup)
        measured["facts"] = bench_machine.brief_facts(load)
        kept.write_text(json.dumps(measured, indent=1) + "\n")
    args.output.write_text(render(json.loads(kept.read_text())))
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
