"""The polls of jobs AWAITING their provider: the prober's batches, and the provider's callbacks.

The prober (castad_runtime.stage.probes) claims a batch of jobs whose poll is due, asks the provider how each
goes, and records the outcomes; work found done or failed is then ready for a claim (the READY predicate of
castad_runtime.stage.repository.claiming), as a callback makes it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Collection

import sqlalchemy as sa

from castad_runtime import db, tables
from castad_runtime.stage import machine

jobs = tables.jobs

# Up to `limit` jobs AWAITING their provider whose poll is due and not brought forward, for one batch of probes:
# each is due again `lease_s` later, so that nothing else asks for it meanwhile (and it is asked again should this
# process die). That new due_at is the probe's claim: its outcome is recorded only while the row still has it.
# (The chosen rows are a materialized CTE: a subquery in `id IN (...)` may be run again for each row of a join,
# each run finding other rows, and then more than `limit` rows are claimed.)
CLAIM_PROBES = """
WITH due AS MATERIALIZED (
    SELECT id FROM jobs WHERE status = 'AWAITING' AND due_at > submitted_at AND due_at <= now()
    ORDER BY due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE jobs SET due_at = now() + make_interval(secs => %(lease_s)s)
FROM due WHERE jobs.id = due.id
RETURNING jobs.id, handle, due_at, polls, coalesce(extract(epoch FROM now() - submitted_at), 0) AS waited_s
"""

# A batch of probes' outcomes: work not had yet is due again after its wait (one more poll, if the provider was
# asked); work found done or failed is ready for a claim (due at its submit, as a callback makes it). Only rows
# still as the probe claimed them.
RECORD_PROBES = """
UPDATE jobs SET updated_at = now(), polls = jobs.polls + probe.asked,
    due_at = CASE WHEN probe.ready THEN jobs.submitted_at ELSE now() + make_interval(secs => probe.wait_s) END
FROM unnest(%s::uuid[], %s::timestamptz[], %s::bool[], %s::float8[], %s::int[])
    AS probe(id, claimed_due, ready, wait_s, asked)
WHERE jobs.id = probe.id AND jobs.status = 'AWAITING' AND jobs.due_at = probe.claimed_due
"""


@dataclasses.dataclass(frozen=True)
class Probe:
    """A job AWAITING its provider, claimed for one probe: `claimed_due` is the claim (its row's due_at)."""

    id: uuid.UUID
    handle: str
    claimed_due: dt.datetime
    polls: int
    waited_s: float


@dataclasses.dataclass(frozen=True)
class Probed:
    """A probe's outcome: `ready` for a claim (the work is done or failed), or due again in `wait_s`.

    `asked`: the provider said the work is not done yet (the schedule's wait grows); not when the poll never went.
    """

    probe: Probe
    ready: bool
    wait_s: float = 0.0
    asked: bool = True


def claim_probes(conn: sa.Connection, limit: int, lease_s: float) -> list[Probe]:
    """Up to `limit` jobs whose poll is due, for the prober; each due again after `lease_s` until its probe is had."""
    rows = db.run(conn, CLAIM_PROBES, {"limit": limit, "lease_s": lease_s})
    return [Probe(row.id, row.handle, row.due_at, row.polls, float(row.waited_s)) for row in rows]


def record_probes(conn: sa.Connection, outcomes: Collection[Probed]) -> int:
    """Record a batch of probes' outcomes, for the jobs that are still as their probe claimed them; how many."""
    if not outcomes:
        return 0
    params = (
        [outcome.probe.id for outcome in outcomes],
        [outcome.probe.claimed_due for outcome in outcomes],
        [outcome.ready for outcome in outcomes],
        [outcome.wait_s for outcome in outcomes],
        [1 if outcome.asked and not outcome.ready else 0 for outcome in outcomes],
    )
    return db.run(conn, RECORD_PROBES, params, prepare=db.REPLAN).rowcount


def poll_now(conn: sa.Connection, pipeline_id: str) -> bool:
    """The provider says it is done (its callback): the job's poll is due at once. True if one was waiting.

    A job a worker holds (submitting its work, or polling it just before the provider finished) keeps the
    callback in `called_back_at`: the poll `await_provider` schedules for it is then due at once.
    """
    awaiting = jobs.c.status == machine.Status.AWAITING
    row = conn.execute(
        jobs.update()
        .where(jobs.c.pipeline_id == pipeline_id, jobs.c.status.in_([machine.Status.AWAITING, machine.Status.RUNNING]))
        .values(
            due_at=sa.case((awaiting, sa.func.least(jobs.c.due_at, jobs.c.submitted_at)), else_=jobs.c.due_at),
            called_back_at=sa.case((awaiting, jobs.c.called_back_at), else_=sa.func.now()),
        )
        .returning(jobs.c.status)
    ).fetchone()
    return row is not None and row.status == machine.Status.AWAITING
