"""The claims of a stage's jobs: a trigger makes its job due, a claim takes it under a lease, leases are kept.

A claim takes the next fair turn's job (castad_runtime.stage.fair) or the most overdue one, within the provider's
quota (castad_runtime.stage.quota), and opens its attempt; the leases of the claims a process holds are renewed,
and those that ran out are found for a recovery. The jobs not ended are counted here too, on the same partial
indexes. The Job they return is castad_runtime.stage.repository's; how its attempt ends: the `attempts` module.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from castad_contracts import events, ids
from psycopg.types.json import Jsonb

from castad_runtime import db, tables
from castad_runtime.stage import fair, machine, quota, repository

jobs = tables.jobs

# The hot path's statements as plain SQL (castad_runtime.db.run). The status lists are literal, as in the
# partial indexes' predicates (jobs_due, jobs_leased), so that the planner matches them.

# A trigger: a PENDING job due now. A job reopened by a retry before its trigger came (WAITING) becomes
# PENDING; a job that has its input already (a duplicate trigger, or a job canceled first) is left alone.
ACCEPT_TRIGGER = """
INSERT INTO jobs (id, pipeline_id, status, max_attempts, due_at, input, input_version, traceparent, tracestate,
                  tenant, weight)
VALUES (%(id)s, %(pipeline_id)s, 'PENDING', %(max_attempts)s, now(), %(input)s, %(input_version)s, %(traceparent)s,
        %(tracestate)s, %(tenant)s, %(weight)s)
ON CONFLICT (pipeline_id) DO UPDATE
SET input = EXCLUDED.input, input_version = EXCLUDED.input_version, traceparent = EXCLUDED.traceparent,
    tracestate = EXCLUDED.tracestate, tenant = EXCLUDED.tenant, weight = EXCLUDED.weight,
    status = CASE WHEN jobs.status = 'WAITING' THEN 'PENDING' ELSE jobs.status END,
    due_at = now(), version = jobs.version + 1, updated_at = now()
WHERE jobs.input IS NULL
RETURNING status
"""

# Compare-and-set a claimable job to RUNNING under a lease (a job AWAITING its provider goes on with the attempt
# that submitted its work; any other starts a new one): the job {chosen} names, if it is still claimable.
_UPDATE = (
    """
UPDATE jobs
SET status = 'RUNNING', version = version + 1,
    attempts = CASE WHEN status = 'AWAITING' THEN attempts ELSE attempts + 1 END,
    lease_owner = %(worker)s, lease_expires_at = now() + make_interval(secs => %(lease_s)s), updated_at = now()
WHERE id = {chosen} AND status IN ('PENDING', 'RETRY_WAIT', 'AWAITING')
RETURNING """
    + repository.JOB_COLUMNS
)
# Which job: the next fair turn's (castad_runtime.stage.fair), or, oldest first, the most overdue claimable job.
# Either only one whose input this release reads (`reads`: the newest version of the stage's trigger it knows; NULL,
# stored before versions were kept, as the release that stored it read it): one stored by a newer release waits,
# untouched, for a replica of it.
_OLDEST = """(
    SELECT id FROM jobs WHERE {claimable} AND due_at <= now() AND coalesce(input_version, 0) <= %(reads)s
    ORDER BY due_at LIMIT 1 FOR UPDATE SKIP LOCKED
)"""


def _claims(claimable: str) -> tuple[str, str]:
    """The claim statements of jobs `claimable` (SQL): by fair turns, and oldest first."""
    return fair.claim(claimable, _UPDATE), _UPDATE.format(chosen=_OLDEST.format(claimable=claimable))


CLAIM, CLAIM_OLDEST = _claims("status IN ('PENDING', 'RETRY_WAIT', 'AWAITING')")
CLAIM_POLL, CLAIM_POLL_OLDEST = _claims("status = 'AWAITING'")  # no new attempt may start

# While the service's prober asks the provider in batches how waiting work goes (castad_runtime.stage.probes), a
# claim takes a job AWAITING its provider only once it is ready: its poll brought forward to its submit (a callback,
# or a probe that found the work done or failed). The same predicate as the partial index jobs_claimable.
READY = "status = 'AWAITING' AND due_at <= submitted_at"
CLAIM_PROBED, CLAIM_PROBED_OLDEST = _claims(f"(status IN ('PENDING', 'RETRY_WAIT') OR ({READY}))")
CLAIM_POLL_PROBED, CLAIM_POLL_PROBED_OLDEST = _claims(READY)

# RUNNING jobs whose lease ran out (jobs_leased), but for those this process still runs, locked.
EXPIRED_LEASES = f"""
SELECT {repository.JOB_COLUMNS} FROM jobs
WHERE status = 'RUNNING' AND lease_expires_at < now() AND NOT id = ANY(%(exclude)s::uuid[])
ORDER BY lease_expires_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
"""

# The job its trigger just made due, claimed in the same transaction (by the handler, into a free slot).
CLAIM_PENDING = f"""
UPDATE jobs
SET status = 'RUNNING', version = version + 1, attempts = attempts + 1,
    lease_owner = %(worker)s, lease_expires_at = now() + make_interval(secs => %(lease_s)s), updated_at = now()
WHERE pipeline_id = %(pipeline_id)s AND status = 'PENDING' AND due_at <= now()
RETURNING {repository.JOB_COLUMNS}
"""

READS_ANY = 2**31 - 1

OPEN_ATTEMPT = "INSERT INTO attempts (job_id, number, worker, outcome) VALUES (%s, %s, %s, 'running')"

# The leases of these claims (job id and version) that are still current, extended; their job ids.
RENEW_LEASES = """
UPDATE jobs SET lease_expires_at = now() + make_interval(secs => %s)
FROM unnest(%s::uuid[], %s::int[]) AS claim(id, version)
WHERE jobs.id = claim.id AND jobs.version = claim.version AND jobs.status = 'RUNNING'
RETURNING jobs.id
"""


def accept_trigger(
    conn: sa.Connection,
    pipeline_id: str,
    job_input: dict[str, Any],
    input_version: int,
    max_attempts: int,
    traceparent: str | None,
    tracestate: str | None,
    share: events.Share | None = None,
) -> bool:
    """Record the stage's trigger, `job_input` as version `input_version` of its type, and whose work it is.

    A PENDING job, due now. A job reopened by a retry before its trigger came (WAITING) becomes PENDING; a job
    canceled before its trigger came keeps it for a later retry. True if a job is now due.
    """
    row = db.run(
        conn,
        ACCEPT_TRIGGER,
        {
            "id": ids.time_ordered(),  # a job a pipeline: its index grows at the pipeline rate
            "pipeline_id": pipeline_id,
            "max_attempts": max_attempts,
            "input": Jsonb(job_input),
            "input_version": input_version,
            "traceparent": traceparent,
            "tracestate": tracestate,
            "tenant": share.tenant if share else "",
            "weight": share.weight if share else 1,
        },
    ).fetchone()
    return row is not None and row.status == machine.Status.PENDING


@dataclasses.dataclass(frozen=True)
class QuotaWait:
    """No job was claimed, though one is due: the provider's quota held it back (`quota.NO_TOKEN`, ...)."""

    reason: str


def claim_next(
    conn: sa.Connection,
    worker: str,
    lease_s: float,
    provider: str | None = None,
    probed: bool = False,
    reads: int | None = None,
    fair: bool = True,
) -> repository.Job | QuotaWait | None:
    """Claim a claimable job whose input this release reads under a lease, and open its attempt.

    The job of the next fair turn across tenants (castad_runtime.stage.fair), oldest first within its tenant; or,
    not `fair`, the most overdue of all, as before fair turns (bench/fairness.py measures both).

    `reads`: the newest version of the stage's trigger this release knows (None: any); a job stored as a newer
    one is left for a replica of a newer release.

    The job is compare-and-set to RUNNING. A job AWAITING its provider goes on with the attempt that submitted its
    work; `probed`: the service's prober polls such jobs, and a claim takes one only once it is ready.

    `provider`: claims call this provider, within its quota: none while its rate is spent or it asked
    to wait, and no new attempt while as many jobs as it allows are at it. When that holds back a job
    that is due: QuotaWait (found by one more indexed query, made only then)."""
    claimable = machine.CLAIMABLE
    gate = None
    if provider is not None:
        gate = quota.gate(conn, provider)
        if not gate.open:
            assert gate.closed_by is not None
            return QuotaWait(gate.closed_by) if _any_due(conn, machine.CLAIMABLE, probed) else None
        if not gate.new_work:
            claimable = frozenset({machine.Status.AWAITING})
    if claimable == machine.CLAIMABLE:
        statements = (CLAIM_PROBED, CLAIM_PROBED_OLDEST) if probed else (CLAIM, CLAIM_OLDEST)
    else:
        statements = (CLAIM_POLL_PROBED, CLAIM_POLL_PROBED_OLDEST) if probed else (CLAIM_POLL, CLAIM_POLL_OLDEST)
    statement = statements[0] if fair else statements[1]
    reads_up_to = READS_ANY if reads is None else reads
    row = db.run(conn, statement, {"worker": worker, "lease_s": lease_s, "reads": reads_up_to}).fetchone()
    if row is None:
        if gate is not None and not gate.new_work and _any_due(conn, machine.NEW_ATTEMPT):
            return QuotaWait(quota.IN_FLIGHT_CAP)
        return None
    job = repository.job_of(row)
    if not job.polling:
        db.run(conn, OPEN_ATTEMPT, (job.id, job.attempts, worker))
    if provider is not None and gate is not None:
        quota.spend(conn, provider, gate)
    return job


def claim_pending(conn: sa.Connection, pipeline_id: str, worker: str, lease_s: float) -> repository.Job | None:
    """Claim the pipeline's PENDING job under a lease and open its attempt (see claim_next).

    None if it is not PENDING and due.
    """
    row = db.run(conn, CLAIM_PENDING, {"pipeline_id": pipeline_id, "worker": worker, "lease_s": lease_s}).fetchone()
    if row is None:
        return None
    job = repository.job_of(row)
    db.run(conn, OPEN_ATTEMPT, (job.id, job.attempts, worker))
    return job


def _any_due(conn: sa.Connection, statuses: frozenset[machine.Status], probed: bool = False) -> bool:
    """Whether a job of these statuses is due for a claim (`probed`: of those AWAITING, only the ready ones)."""
    due = sa.select(jobs.c.id).where(jobs.c.status.in_(list(statuses)), jobs.c.due_at <= sa.func.now())
    if probed:
        due = due.where(sa.or_(jobs.c.status != machine.Status.AWAITING, jobs.c.due_at <= jobs.c.submitted_at))
    return conn.execute(sa.select(due.limit(1).exists())).scalar_one()


def claims_due(conn: sa.Connection) -> bool:
    """Whether work is due for a claim of the runner while a prober polls (a prober leaves it quota tokens)."""
    return _any_due(conn, machine.CLAIMABLE, probed=True)


def renew_leases(conn: sa.Connection, claimed: Collection[repository.Job], lease_s: float) -> set[uuid.UUID]:
    """Heartbeat: extend the lease of each of these claims that is still the current one; their job ids."""
    params = (lease_s, [job.id for job in claimed], [job.version for job in claimed])
    return {row.id for row in db.run(conn, RENEW_LEASES, params, prepare=db.REPLAN)}


def expired_leases(conn: sa.Connection, limit: int, exclude: Collection[uuid.UUID] = ()) -> list[repository.Job]:
    """RUNNING jobs whose lease ran out, but for those this process still runs (`exclude`).

    After an outage longer than the lease, the heartbeat of the excluded attempts renews them, or their finish
    records them.
    """
    rows = db.run(conn, EXPIRED_LEASES, {"exclude": list(exclude), "limit": limit})
    return [repository.job_of(row) for row in rows]


@dataclasses.dataclass(frozen=True)
class Counts:
    """The jobs not ended, for the metrics.

    By status, those due (claimable and waiting for a slot or the quota), and those RUNNING whose lease ran out and
    that no one recovered yet.
    """

    by_status: dict[machine.Status, int]
    due: int
    lease_expired: int
    for_newer: int = 0  # of those due, the ones whose input only a newer release reads (`claim_next`'s `reads`)


COUNTED = (machine.Status.PENDING, machine.Status.RETRY_WAIT, machine.Status.AWAITING, machine.Status.RUNNING)


def counts(conn: sa.Connection, reads: int = READS_ANY) -> Counts:
    """One statement, each part on a partial index (jobs_due, jobs_leased): what a scrape reads."""
    # The status lists are literal SQL, as in the indexes' predicates, so that the planner matches them.
    claimable = sa.literal_column("status IN ('PENDING', 'RETRY_WAIT', 'AWAITING')", sa.Boolean)
    waiting = (
        sa.select(
            jobs.c.status,
            sa.func.count().label("jobs"),
            sa.func.count().filter(jobs.c.due_at <= sa.func.now()).label("due"),
            sa.literal(0).label("lease_expired"),
            sa.func.count()
            .filter(jobs.c.due_at <= sa.func.now(), sa.func.coalesce(jobs.c.input_version, 0) > reads)
            .label("for_newer"),
        )
        .where(claimable)
        .group_by(jobs.c.status)
    )
    running = sa.select(
        sa.literal(machine.Status.RUNNING.value),
        sa.func.count(),
        sa.literal(0),
        sa.func.count().filter(jobs.c.lease_expires_at < sa.func.now()),
        sa.literal(0),
    ).where(sa.literal_column("status = 'RUNNING'", sa.Boolean))
    rows = conn.execute(sa.union_all(waiting, running)).all()
    by_status = dict.fromkeys(COUNTED, 0) | {machine.Status(row[0]): row[1] for row in rows}
    return Counts(
        by_status,
        due=sum(row[2] for row in rows),
        lease_expired=sum(row[3] for row in rows),
        for_newer=sum(row[4] for row in rows),
    )
