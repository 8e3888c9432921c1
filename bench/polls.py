"""Polls of 100,000 jobs waiting at a provider: how late each is polled, and what a poll costs.

On a scratch stage database (the lyric service's migrations), `JOBS` jobs wait AWAITING their provider, their
polls falling due evenly over `WINDOW_S` seconds (so `JOBS / WINDOW_S` polls a second are due). The provider is
in this process and answers every poll "not yet" after `ANSWER_S` of waiting, as a network API would, without
using the CPU: what is measured is the machinery around a poll, not an HTTP client.

- `batched` (now): the stage's prober (castad_runtime.stage.probes) with the service's default batch and
  threads: one transaction claims a batch of due polls, one records what they found.
- `claimed` (before, the same code with `CASTAD_<STAGE>_PROBE_BATCH=0`): each poll a claim of its own by the
  scheduler's slots (as many as the prober's threads), its attempt run and recorded as every attempt is;
  `BEFORE_JOBS` jobs over the same window, as it cannot keep up with more.

Lateness is from a poll's due time (the database's clock) to the moment it is asked; CPU is this process's
(prober or runner, and the fake) and the PostgreSQL backends of the scratch database, per poll; commits per poll
from pg_stat_database. Written to docs/reports/polls.md by bench/templates/polls.md.j2 and kept in polls.json (`make
bench-polls`; `--render` writes the page again from the JSON).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import db
from castad_runtime.stage import cancellation, machine, outcomes, probes, remote, repository, runner, scheduler
from castad_runtime.stage import service as stage_service
from castad_testkit import latency, scratch
from castad_testkit import machine as bench_machine

from bench import commits, cpu, pages

JOBS = 100_000
BEFORE_JOBS = 3_000
WINDOW_S = 100.0
LEAD_S = 20.0  # from the start of a run (before the jobs are written) to the first poll due
ANSWER_S = 0.02  # the provider's answer time
LIMIT_S = 120.0  # a run gives up this long after its last poll was due
ON_TIME_S = 2.0
NEVER = remote.PollSchedule(first_s=3600.0, max_s=3600.0, give_up_s=7200.0)  # each job is polled once here


class Waiting:
    """A provider whose work is never done: each poll waits ANSWER_S, notes when it came, and says "not yet"."""

    def __init__(self) -> None:
        self.asked: dict[str, float] = {}
        self._lock = threading.Lock()

    def submit(self, job: repository.Job, callback_url: str | None, cancel: cancellation.Cancellation) -> Any:
        raise AssertionError("nothing is submitted here")

    def poll(self, handle: str, cancel: cancellation.Cancellation) -> remote.Pending:
        at = time.time()
        with self._lock:
            self.asked.setdefault(handle, at)
        cancel.sleep(ANSWER_S)
        return remote.Pending("RUNNING")


def never_done(job: repository.Job, finished: remote.Finished, cancel: cancellation.Cancellation) -> outcomes.Output:
    raise AssertionError("the provider here never finishes")


def fill(engine: sa.Engine, jobs: int, window_s: float) -> dict[str, float]:
    """`jobs` jobs AWAITING, their polls due evenly over `window_s` from LEAD_S on; each handle's due time."""
    with db.transaction(engine) as conn:
        conn.execute(sa.text("TRUNCATE jobs, attempts"))
        # Without the in-flight triggers (no cap here): 100,000 updates of one counter row in one transaction would
        # take minutes, where a service inserts its jobs one transaction each.
        conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
        start = conn.execute(sa.select(sa.func.extract("epoch", sa.func.clock_timestamp()))).scalar_one()
        conn.execute(
            sa.text(
                "INSERT INTO jobs (id, pipeline_id, status, attempts, max_attempts, due_at, input, handle,"
                " submitted_at, lease_owner)"
                " SELECT gen_random_uuid(), 'p-' || n, 'AWAITING', 1, 5,"
                " to_timestamp(:start + :lead + (n - 1) * :step), '{}'::jsonb, 'w-' || n, now(), NULL"
                " FROM generate_series(1, :jobs) AS n"
            ),
            {"start": float(start), "lead": LEAD_S, "step": window_s / jobs, "jobs": jobs},
        )
        conn.execute(
            sa.text("INSERT INTO attempts (job_id, number, worker, outcome) SELECT id, 1, 'bench', 'running' FROM jobs")
        )
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("VACUUM ANALYZE jobs, attempts"))
    step = window_s / jobs
    if time.time() > float(start) + LEAD_S:
        raise RuntimeError(f"filling the jobs took more than {LEAD_S:g} s: the first polls would be late already")
    return {f"w-{n}": float(start) + LEAD_S + (n - 1) * step for n in range(1, jobs + 1)}


def one_run(engine: sa.Engine, name: str, variant: str, jobs: int, window_s: float) -> dict[str, Any]:
    due = fill(engine, jobs, window_s)
    api = Waiting()
    work = remote.work(api, NEVER, lambda job: None, never_done)
    defaults = stage_service.StageSettings.model_fields
    batch, threads = defaults["probe_batch"].default, defaults["probe_threads"].default
    policy = machine.RetryPolicy(5, 1.0, 60.0, jitter=0.0)
    stage = runner.StageRunner(
        events.Stage.LYRIC,
        engine,
        work,
        events.LyricCompleted,
        runner.Limits(policy),
        "bench",
        probed=variant == "batched",
    )
    if variant == "batched":
        part: Any = probes.Prober(
            engine, work.probe, provider=None, batch=batch, threads=threads, lease_s=120.0, timeout_s=120.0
        )
    else:
        part = scheduler.JobScheduler(stage, threads, poll_s=0.5)
    backends = cpu.postgres_backends(name)
    pg_before, own_before = cpu.snapshot(backends), time.process_time()
    commits_before = commits.read([name], settle=False)[name]
    part.start()
    deadline = time.monotonic() + LEAD_S + window_s + LIMIT_S
    try:
        while len(api.asked) < jobs and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        part.stop()
    own, pg = time.process_time() - own_before, cpu.used(pg_before, cpu.snapshot(backends))
    transactions = commits.read([name])[name] - commits_before
    polls = len(api.asked)
    late = sorted(max(0.0, at - due[handle]) for handle, at in api.asked.items())
    return {
        "variant": variant,
        "jobs": jobs,
        "polled": polls,
        "batch": batch if variant == "batched" else 1,
        "threads": threads,
        "due_per_s": jobs / window_s,
        "late_s": dict(latency.summary(late)) if late else {},
        "on_time_share": sum(1 for s in late if s <= ON_TIME_S) / jobs,
        "process_cpu_ms_per_poll": own * 1000 / max(polls, 1),
        "postgres_cpu_ms_per_poll": pg * 1000 / max(polls, 1),
        "commits_per_poll": transactions / max(polls, 1),
    }


def run(cleanup: scratch.Cleanup, jobs: int, before_jobs: int, window_s: float) -> dict[str, Any]:
    name = f"castad_bench_{scratch.RUN_ID}_polls"
    results = []
    with cleanup.scope():
        engine = scratch.stage_database(cleanup, name, pool_size=40)
        for variant, count in (("claimed", before_jobs), ("batched", jobs)):
            results.append(one_run(engine, name, variant, count, window_s))
            got = results[-1]
            print(
                f"{variant}: {got['polled']:,} of {count:,} polled, {got['on_time_share']:.1%} within {ON_TIME_S:g} s",
                flush=True,
            )
    return {"runs": results, "window_s": window_s, "answer_s": ANSWER_S, "on_time_s": ON_TIME_S}


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/polls.md.j2 from the measurements."""
    runs = {got["variant"]: got for got in measured["runs"]}
    return pages.render("polls.md.j2", measured=measured, now=runs["batched"], before=runs["claimed"])


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run both ways of polling as `args` ask; return the measurements the page is written from."""
    load = bench_machine.load()
    cleanup = scratch.Cleanup()
    with scratch.interrupt_on_sigterm():
        measured = run(cleanup, args.jobs, args.before_jobs, args.window_s)
    return {**measured, "facts": bench_machine.brief_facts(load)}


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("polls", __doc__)
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--before-jobs", type=int, default=BEFORE_JOBS)
    parser.add_argument("--window-s", type=float, default=WINDOW_S, help="the polls fall due over this long")
    args = parser.parse_args(argv)
    pages.write(args.output, render, None if args.render else measure(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
