"""Every SQL statement on the jobs and attempts tables."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Collection
from typing import Any, TypeVar

import sqlalchemy as sa
from castad_contracts import codes, events, ids
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import postgresql as pg

from castad_runtime import db, tables
from castad_runtime.stage import fair, machine, quota

jobs = tables.jobs
attempts = tables.attempts
P = TypeVar("P", bound=events.Payload)

# The hot path's statements as plain SQL (castad_runtime.db.run). The status lists are literal, as in the
# partial indexes' predicates (jobs_due, jobs_leased), so that the planner matches them.
JOB_COLUMNS = """id, pipeline_id, status, version, attempts, counted_attempts, max_attempts, input, traceparent,
    tracestate, handle, submitted_at, polls, coalesce(extract(epoch FROM now() - submitted_at), 0) AS waited_s,
    reopened, previous_handle, extract(epoch FROM now() - previous_submitted_at) AS previous_waited_s, input_version,
    created_at, review"""

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
    + JOB_COLUMNS
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

# RUNNING jobs whose lease ran out (jobs_leased), but for those this process still runs, locked.
EXPIRED_LEASES = f"""
SELECT {JOB_COLUMNS} FROM jobs
WHERE status = 'RUNNING' AND lease_expires_at < now() AND NOT id = ANY(%(exclude)s::uuid[])
ORDER BY lease_expires_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
"""

# The job its trigger just made due, claimed in the same transaction (by the handler, into a free slot).
CLAIM_PENDING = f"""
UPDATE jobs
SET status = 'RUNNING', version = version + 1, attempts = attempts + 1,
    lease_owner = %(worker)s, lease_expires_at = now() + make_interval(secs => %(lease_s)s), updated_at = now()
WHERE pipeline_id = %(pipeline_id)s AND status = 'PENDING' AND due_at <= now()
RETURNING {JOB_COLUMNS}
"""

READS_ANY = 2**31 - 1

OPEN_ATTEMPT = "INSERT INTO attempts (job_id, number, worker, outcome) VALUES (%s, %s, %s, 'running')"

# The attempt's work is about to leave for its provider: recorded on its attempt row, only while its claim is the
# current one (CAS on version) with at least margin_s of its lease left by the database's clock; the lease left.
# The job row is locked (FOR SHARE): a cancel or a recovery of the lease under way in another transaction is
# waited for, and the claim judged by what it committed, not by the row as it was before.
RECORD_SUBMISSION = """
WITH claim AS (
    SELECT id, lease_expires_at FROM jobs
    WHERE id = %(id)s AND version = %(version)s AND status = 'RUNNING'
        AND lease_expires_at > clock_timestamp() + make_interval(secs => %(margin_s)s)
    FOR SHARE
)
UPDATE attempts SET submitted_at = clock_timestamp(), submission_key = %(key)s, untold_calls = untold_calls + 1
FROM claim
WHERE attempts.job_id = claim.id AND attempts.number = %(number)s AND attempts.outcome = 'running'
RETURNING extract(epoch FROM claim.lease_expires_at - clock_timestamp()) AS lease_left_s
"""

# The leases of these claims (job id and version) that are still current, extended; their job ids.
RENEW_LEASES = """
UPDATE jobs SET lease_expires_at = now() + make_interval(secs => %s)
FROM unnest(%s::uuid[], %s::int[]) AS claim(id, version)
WHERE jobs.id = claim.id AND jobs.version = claim.version AND jobs.status = 'RUNNING'
RETURNING jobs.id
"""

# Move a RUNNING job on and end its attempt, only if the claim is still the current one (CAS on version);
# how many jobs moved (0 or 1).
FINISH_ATTEMPT = """
WITH moved AS (
    UPDATE jobs
    SET status = %(status)s, lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
        counted_attempts = counted_attempts + %(counted)s,
        previous_handle = coalesce(handle, previous_handle),
        previous_submitted_at = CASE WHEN handle IS NULL THEN previous_submitted_at ELSE submitted_at END,
        handle = NULL, submitted_at = NULL, polls = 0,
        called_back_at = NULL,
        due_at = CASE WHEN %(retry_in_s)s::float8 IS NULL THEN due_at
                      ELSE now() + make_interval(secs => %(retry_in_s)s) END,
        finished_at = CASE WHEN %(terminal)s THEN now() ELSE finished_at END,
        result = coalesce(%(result)s, result),
        last_error_code = coalesce(%(error_code)s, last_error_code),
        last_error_message = CASE WHEN %(error_code)s::text IS NULL THEN last_error_message
                                  ELSE %(error_message)s END
    WHERE id = %(id)s AND version = %(version)s AND status = 'RUNNING'
    RETURNING id
), ended AS (
    UPDATE attempts
    SET finished_at = now(), outcome = %(outcome)s, error_code = %(error_code)s, error_message = %(error_message)s
    WHERE job_id IN (SELECT id FROM moved) AND number = %(number)s
)
SELECT count(*) AS moved FROM moved
"""


@dataclasses.dataclass(frozen=True)
class Job:
    id: uuid.UUID
    pipeline_id: str
    status: machine.Status
    version: int
    attempts: int  # attempts started, this one included: its number
    counted_attempts: int  # attempts charged against max_attempts before this one
    max_attempts: int
    input: dict[str, Any]
    traceparent: str | None
    tracestate: str | None
    handle: str | None = None  # the provider's id of the work this attempt submitted (AWAITING), if any
    submitted_at: dt.datetime | None = None
    polls: int = 0  # polls that found the provider's work unfinished
    waited_s: float = 0.0  # since the submit, by the database's clock at the claim
    reopened: int = 0  # operator retries that reopened the job (its runs, less the first)
    previous_handle: str | None = None  # the work an earlier attempt left at the provider, looked up first
    previous_waited_s: float | None = None  # since that work was submitted (None: not known, or no such work)
    input_version: int | None = None  # the version of the stage's trigger `input` is stored as (None: the newest)
    created_at: dt.datetime | None = None  # when the stage first heard of the job (None: not said)
    review: dict[str, Any] | None = None  # its draft and what a person decided (castad_runtime.stage.reviews)

    def trigger(self, model: type[P], registry: events.Registry = events.REGISTRY) -> P:
        """The job's input as `model`, the release's model of the stage's trigger.

        Read from the version it was stored as, through the same upcasts as an event of that version."""
        event_type = registry.type_of(model)
        version = self.input_version or registry.current_version(event_type)
        payload = registry.read(event_type, version, self.input)
        assert isinstance(payload, model)
        return payload

    @property
    def next_round(self) -> int:
        """The round of the job's next draft for a review: 0 for its first, one more than its last's after."""
        return self.review["round"] + 1 if self.review and "round" in self.review else 0

    @property
    def polling(self) -> bool:
        """The attempt has submitted its work to a provider: this claim asks how it goes."""
        return self.handle is not None

    @property
    def submission_key(self) -> str:
        """The key of the work this attempt sends to a provider (its idempotency key, or its tag).

        The same for every claim of one counted attempt: an attempt the machinery lost (its lease
        expired, its worker stopped) and that is claimed again sends its work under the same key. A
        new one after a failure that counted, and for every run an operator's retry starts."""
        return f"castad-{self.pipeline_id}-{self.reopened}-{self.counted_attempts + 1}"


def _job(row: Any) -> Job:
    values = row._asdict()
    values["status"] = machine.Status(values["status"])
    values["waited_s"] = float(values["waited_s"])
    if values["previous_waited_s"] is not None:
        values["previous_waited_s"] = float(values["previous_waited_s"])
    return Job(**values)


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
class Held:
    """A job row locked for an operator request."""

    id: uuid.UUID
    status: machine.Status
    attempts: int
    input: dict[str, Any] | None
    last_operation: int


def lock(conn: sa.Connection, pipeline_id: str) -> Held | None:
    row = conn.execute(
        sa.select(jobs.c.id, jobs.c.status, jobs.c.attempts, jobs.c.input, jobs.c.last_operation)
        .where(jobs.c.pipeline_id == pipeline_id)
        .with_for_update()
    ).first()
    if row is None:
        return None
    return Held(row.id, machine.Status(row.status), row.attempts, row.input, row.last_operation)


def add_canceled(
    conn: sa.Connection, pipeline_id: str, operation: int, reason: str, max_attempts: int
) -> uuid.UUID | None:
    """A CANCELED job without input, so that the trigger, should it come, starts nothing. None if a job exists."""
    return _add_without_input(
        conn,
        pipeline_id,
        operation,
        max_attempts,
        status=machine.Status.CANCELED,
        last_error_code=codes.ErrorCode.CANCELED,
        last_error_message=reason,
        finished_at=sa.func.now(),
    )


def add_waiting(conn: sa.Connection, pipeline_id: str, operation: int, max_attempts: int) -> uuid.UUID | None:
    """A WAITING job without input: its trigger, when it comes, makes it PENDING. None if a job exists."""
    return _add_without_input(conn, pipeline_id, operation, max_attempts, status=machine.Status.WAITING)


def _add_without_input(
    conn: sa.Connection, pipeline_id: str, operation: int, max_attempts: int, **values: Any
) -> uuid.UUID | None:
    return conn.execute(
        pg.insert(jobs)
        .values(
            id=ids.time_ordered(),
            pipeline_id=pipeline_id,
            max_attempts=max_attempts,
            due_at=sa.func.now(),
            last_operation=operation,
            **values,
        )
        .on_conflict_do_nothing(index_elements=[jobs.c.pipeline_id])
        .returning(jobs.c.id)
    ).scalar()


def cancel(conn: sa.Connection, held: Held, operation: int, reason: str) -> None:
    """Cancel a job that has not ended; a running attempt ends as `canceled` (its worker loses the claim)."""
    machine.check_transition(held.status, machine.Status.CANCELED)
    conn.execute(
        jobs.update()
        .where(jobs.c.id == held.id)
        .values(
            status=machine.Status.CANCELED,
            version=jobs.c.version + 1,
            lease_owner=None,
            lease_expires_at=None,
            last_operation=operation,
            last_error_code=codes.ErrorCode.CANCELED,
            last_error_message=reason,
            previous_handle=sa.func.coalesce(jobs.c.handle, jobs.c.previous_handle),  # an operator's retry looks
            previous_submitted_at=sa.case(
                (jobs.c.handle.is_(None), jobs.c.previous_submitted_at), else_=jobs.c.submitted_at
            ),
            handle=None,
            called_back_at=None,
            finished_at=sa.func.now(),
            updated_at=sa.func.now(),
        )
    )
    if held.status in (machine.Status.RUNNING, machine.Status.AWAITING, machine.Status.REVIEW):
        _end_attempt(
            conn, held.id, held.attempts, "canceled", error_code=codes.ErrorCode.CANCELED, error_message=reason
        )


def _end_attempt(conn: sa.Connection, job_id: uuid.UUID, number: int, outcome: str, **errors: str) -> None:
    """End the job's attempt `number` with `outcome`, if it is still running."""
    conn.execute(
        attempts.update()
        .where(attempts.c.job_id == job_id, attempts.c.number == number, attempts.c.outcome == "running")
        .values(finished_at=sa.func.now(), outcome=outcome, **errors)
    )


def reopen(
    conn: sa.Connection,
    held: Held,
    operation: int,
    status: machine.Status,
    max_attempts: int,
    job_input: dict[str, Any] | None,
) -> None:
    """An operator's retry: the job is due again (or waits for its trigger) with a fresh attempt budget."""
    machine.check_transition(held.status, status)
    conn.execute(
        jobs.update()
        .where(jobs.c.id == held.id)
        .values(
            status=status,
            version=jobs.c.version + 1,
            due_at=sa.func.now(),
            counted_attempts=0,
            reopened=jobs.c.reopened + 1,
            max_attempts=max_attempts,
            input=job_input,
            last_operation=operation,
            finished_at=None,
            updated_at=sa.func.now(),
        )
    )


def note_operation(conn: sa.Connection, held: Held, operation: int) -> None:
    """An operator request that changes nothing here (the job had ended, or it was for another stage)."""
    conn.execute(jobs.update().where(jobs.c.id == held.id).values(last_operation=operation))


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
) -> Job | QuotaWait | None:
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
    job = _job(row)
    if not job.polling:
        db.run(conn, OPEN_ATTEMPT, (job.id, job.attempts, worker))
    if provider is not None and gate is not None:
        quota.spend(conn, provider, gate)
    return job


def claim_pending(conn: sa.Connection, pipeline_id: str, worker: str, lease_s: float) -> Job | None:
    """Claim the pipeline's PENDING job under a lease and open its attempt (see claim_next).

    None if it is not PENDING and due.
    """
    row = db.run(conn, CLAIM_PENDING, {"pipeline_id": pipeline_id, "worker": worker, "lease_s": lease_s}).fetchone()
    if row is None:
        return None
    job = _job(row)
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


def renew_leases(conn: sa.Connection, claimed: Collection[Job], lease_s: float) -> set[uuid.UUID]:
    """Heartbeat: extend the lease of each of these claims that is still the current one; their job ids."""
    params = (lease_s, [job.id for job in claimed], [job.version for job in claimed])
    return {row.id for row in db.run(conn, RENEW_LEASES, params, prepare=db.REPLAN)}


def expired_leases(conn: sa.Connection, limit: int, exclude: Collection[uuid.UUID] = ()) -> list[Job]:
    """RUNNING jobs whose lease ran out, but for those this process still runs (`exclude`).

    After an outage longer than the lease, the heartbeat of the excluded attempts renews them, or their finish
    records them.
    """
    rows = db.run(conn, EXPIRED_LEASES, {"exclude": list(exclude), "limit": limit})
    return [_job(row) for row in rows]


def finish_attempt(
    conn: sa.Connection,
    job: Job,
    status: machine.Status,
    outcome: str,
    *,
    result: dict[str, Any] | None = None,
    error_code: str | None = None,
    error_message: str | None = None,
    retry_in_s: float = 0.0,
    counted: bool = True,
) -> bool:
    """Move a RUNNING job on, only if `job` is still the current claim (CAS on version).

    `counted`: the attempt is charged against max_attempts; an attempt the machinery lost
    (handed back by a stopping worker, lease expired, outage) is not.
    """
    machine.check_transition(job.status, status)
    if status is machine.Status.AWAITING:
        raise ValueError("an attempt whose work waits at its provider goes on: await_provider")
    row = db.run(
        conn,
        FINISH_ATTEMPT,
        {
            "id": job.id,
            "version": job.version,
            "number": job.attempts,
            "status": status.value,
            "outcome": outcome,
            "counted": 1 if counted else 0,
            "retry_in_s": retry_in_s if status is machine.Status.RETRY_WAIT else None,
            "terminal": status.terminal,
            "result": None if result is None else Jsonb(result),
            "error_code": error_code,
            "error_message": error_message,
        },
    ).fetchone()
    return row is not None and row.moved == 1


def await_provider(conn: sa.Connection, job: Job, handle: str, poll_in_s: float, notes: tuple[str, ...] = ()) -> bool:
    """The attempt's work is at the provider under `handle` (just submitted, still unfinished, or an earlier one's).

    The job waits without a worker until a poll is due (in `poll_in_s`, or at once if the provider called back
    meanwhile: `poll_now`); the provider's `notes` on it go on the attempt. CAS on version, like finish_attempt.
    """
    machine.check_transition(job.status, machine.Status.AWAITING)
    if job.polling:
        submitted_at: Any = jobs.c.submitted_at
    elif handle == job.previous_handle:  # an earlier attempt's work, still at work: waited on since its submit
        submitted_at = sa.func.coalesce(jobs.c.previous_submitted_at, sa.func.now())
    else:
        submitted_at = sa.func.now()
    values: dict[str, Any] = {
        "status": machine.Status.AWAITING,
        "lease_owner": None,
        "lease_expires_at": None,
        "handle": handle,
        # ready (READY: due by its submit) if called back while held, else due when the next poll is
        "due_at": sa.case((jobs.c.called_back_at.is_not(None), submitted_at), else_=db.seconds_from_now(poll_in_s)),
        "called_back_at": None,
        "updated_at": sa.func.now(),
    }
    if job.polling:
        values["polls"] = jobs.c.polls + 1
    else:
        values.update(submitted_at=submitted_at, polls=0)
    updated = conn.execute(
        jobs.update()
        .where(jobs.c.id == job.id, jobs.c.version == job.version, jobs.c.status == machine.Status.RUNNING)
        .values(**values)
    )
    if updated.rowcount == 1 and notes:
        conn.execute(
            attempts.update()
            .where(attempts.c.job_id == job.id, attempts.c.number == job.attempts)
            .values(notes="\n".join(notes))
        )
    return updated.rowcount == 1


def draft(conn: sa.Connection, job: Job, review: dict[str, Any], wait_s: float) -> bool:
    """The attempt drafted: the job waits for a person's decision on `review` for `wait_s`, holding no worker.

    CAS on version, like finish_attempt. The attempt stays open: it ends with the review."""
    machine.check_transition(job.status, machine.Status.REVIEW)
    updated = conn.execute(
        jobs.update()
        .where(jobs.c.id == job.id, jobs.c.version == job.version, jobs.c.status == machine.Status.RUNNING)
        .values(
            status=machine.Status.REVIEW,
            version=jobs.c.version + 1,
            lease_owner=None,
            lease_expires_at=None,
            review=review,
            due_at=db.seconds_from_now(wait_s),
            updated_at=sa.func.now(),
        )
    )
    return updated.rowcount == 1


REDRAFTED = "redrafted"  # an attempt's outcome: its draft was reviewed, and a new one asked for
# A job in REVIEW, as JOB_COLUMNS, locked by a statement of its own (no provider's work to have waited on).
_REVIEW_COLUMNS = """id, pipeline_id, status, version, attempts, counted_attempts, max_attempts, input, traceparent,
    tracestate, handle, submitted_at, polls, 0 AS waited_s, reopened, previous_handle,
    extract(epoch FROM now() - previous_submitted_at) AS previous_waited_s, input_version, created_at, review"""


def lock_job(conn: sa.Connection, pipeline_id: str) -> Job | None:
    """The pipeline's job, locked (None: there is none yet)."""
    row = conn.execute(
        sa.text(f"SELECT {_REVIEW_COLUMNS} FROM jobs WHERE pipeline_id = :pipeline_id FOR UPDATE"),
        {"pipeline_id": pipeline_id},
    ).fetchone()
    return None if row is None else _job(row)


def due_reviews(conn: sa.Connection, limit: int) -> list[Job]:
    """Jobs whose draft's review timed out (jobs_review_due), locked; others skip them."""
    rows = conn.execute(
        sa.text(
            f"SELECT {_REVIEW_COLUMNS} FROM jobs WHERE status = 'REVIEW' AND due_at <= now()"
            " ORDER BY due_at LIMIT :limit FOR UPDATE SKIP LOCKED"
        ),
        {"limit": limit},
    ).fetchall()
    return [_job(row) for row in rows]


def end_review(conn: sa.Connection, job: Job, review: dict[str, Any], result: dict[str, Any]) -> None:
    """The draft was approved (by a person or its timeout) or edited: the job SUCCEEDED and its attempt with it.

    `job` is locked (lock_job, due_reviews) and in REVIEW."""
    machine.check_transition(job.status, machine.Status.SUCCEEDED)
    conn.execute(
        jobs.update()
        .where(jobs.c.id == job.id)
        .values(
            status=machine.Status.SUCCEEDED,
            version=jobs.c.version + 1,
            review=review,
            result=result,
            finished_at=sa.func.now(),
            updated_at=sa.func.now(),
        )
    )
    _end_attempt(conn, job.id, job.attempts, "succeeded")


def review_again(
    conn: sa.Connection, job: Job, review: dict[str, Any], status: machine.Status, due_in_s: float
) -> None:
    """The locked job in REVIEW, its `review` changed: PENDING to draft again, or still in REVIEW, due later.

    A new draft ends the attempt that made the last one (REDRAFTED); the next one is not counted against the job's
    attempts."""
    if status != job.status:
        machine.check_transition(job.status, status)
    conn.execute(
        jobs.update()
        .where(jobs.c.id == job.id)
        .values(
            status=status,
            version=jobs.c.version + 1,
            review=review,
            due_at=db.seconds_from_now(due_in_s),
            updated_at=sa.func.now(),
        )
    )
    if status is machine.Status.PENDING:
        _end_attempt(conn, job.id, job.attempts, REDRAFTED)


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


def record_submission(conn: sa.Connection, job: Job, margin_s: float) -> float | None:
    """Record that the attempt's work leaves for the provider now, if its claim still holds.

    It is recorded on the attempt's row, under `job.submission_key`, if `job` is still the current claim and its
    lease has more than `margin_s` left by the database's clock: the seconds of lease left then. None: the claim
    does not hold (the work must not leave).
    """
    params = {"key": job.submission_key, "id": job.id, "version": job.version, "number": job.attempts}
    row = db.run(conn, RECORD_SUBMISSION, {**params, "margin_s": margin_s}).fetchone()
    return None if row is None else float(row.lease_left_s)


def unrecord_submission(conn: sa.Connection, job: Job) -> None:
    """The submission recorded for this attempt did not leave after all."""
    conn.execute(
        attempts.update()
        .where(attempts.c.job_id == job.id, attempts.c.number == job.attempts)
        .values(submitted_at=None, submission_key=None, untold_calls=_ONE_CALL_FEWER)
    )


def refused_call(conn: sa.Connection, job: Job) -> None:
    """The provider refused the attempt's request for work outright ("too many"): no task it bills, not counted."""
    conn.execute(
        attempts.update()
        .where(attempts.c.job_id == job.id, attempts.c.number == job.attempts)
        .values(untold_calls=_ONE_CALL_FEWER)
    )


_ONE_CALL_FEWER = sa.func.greatest(attempts.c.untold_calls - 1, 0)


# The requests for work the attempt sent its provider that no event told yet, told now (castad_runtime.stage.runner).
TELL_CALLS = """
WITH untold AS (
    SELECT id, untold_calls FROM attempts WHERE job_id = %s AND number = %s AND untold_calls > 0 FOR UPDATE
)
UPDATE attempts SET untold_calls = 0 FROM untold WHERE attempts.id = untold.id RETURNING untold.untold_calls
"""


def tell_calls(conn: sa.Connection, job_id: uuid.UUID, number: int) -> int | None:
    """The requests for work attempt `number` sent its provider since its last event, now told (None: none)."""
    row = db.run(conn, TELL_CALLS, (job_id, number)).fetchone()
    return None if row is None else int(row.untold_calls)


@dataclasses.dataclass(frozen=True)
class Submissions:
    """What a job sent to its provider.

    Submissions (attempts whose work left) and the distinct keys they had. At a provider that takes an idempotency
    key, the jobs there are `keys`; at one that takes none, `sent`.
    """

    sent: int
    keys: int


def submissions(conn: sa.Connection, pipeline_ids: Collection[str] | None = None) -> dict[str, Submissions]:
    """Per pipeline whose job sent anything to its provider (or of these pipelines only), its Submissions."""
    query = (
        sa.select(
            jobs.c.pipeline_id,
            sa.func.count(attempts.c.submitted_at).label("sent"),
            sa.func.count(sa.distinct(attempts.c.submission_key)).label("keys"),
        )
        .join(attempts, attempts.c.job_id == jobs.c.id)
        .where(attempts.c.submitted_at.is_not(None))
        .group_by(jobs.c.pipeline_id)
    )
    if pipeline_ids is not None:
        query = query.where(jobs.c.pipeline_id.in_(list(pipeline_ids)))
    return {row.pipeline_id: Submissions(row.sent, row.keys) for row in conn.execute(query)}


def due_at(conn: sa.Connection, job_id: uuid.UUID) -> dt.datetime:
    due: dt.datetime = conn.execute(sa.select(jobs.c.due_at).where(jobs.c.id == job_id)).scalar_one()
    return due


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


@dataclasses.dataclass(frozen=True)
class Finished:
    """A finished job whose files retention is to delete."""

    id: uuid.UUID
    pipeline_id: str
    finished_at: dt.datetime


def unswept(conn: sa.Connection, older_than_s: float, limit: int) -> list[Finished]:
    """Up to `limit` jobs that finished more than `older_than_s` ago and whose files were not deleted since."""
    rows = conn.execute(
        sa.select(jobs.c.id, jobs.c.pipeline_id, jobs.c.finished_at)
        .where(
            sa.text(tables.FINISHED_JOB),
            sa.text(tables.UNSWEPT_JOB),
            jobs.c.finished_at < db.seconds_from_now(-older_than_s),
        )
        .order_by(jobs.c.finished_at)
        .limit(limit)
    )
    return [Finished(row.id, row.pipeline_id, row.finished_at) for row in rows]


def mark_swept(conn: sa.Connection, swept: Collection[Finished]) -> None:
    """Their files are deleted: only for a job that has not ended again since (a retry reopened it meanwhile)."""
    if swept:
        conn.execute(
            jobs.update()
            .where(jobs.c.id == sa.bindparam("job_id"), jobs.c.finished_at == sa.bindparam("seen_finished_at"))
            .values(artifacts_swept_at=sa.func.now()),
            [{"job_id": job.id, "seen_finished_at": job.finished_at} for job in swept],
        )


def forget_finished(conn: sa.Connection, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` finished jobs whose files were deleted; how many.

    A job goes with its attempts once it finished more than `older_than_s` ago and its files were deleted since;
    jobs another transaction holds are skipped. A job that has not finished (PENDING, RUNNING, RETRY_WAIT,
    AWAITING, WAITING) is never deleted.
    """
    swept = sa.select(jobs.c.id).where(sa.text(tables.FINISHED_JOB), jobs.c.artifacts_swept_at >= jobs.c.finished_at)
    doomed = list(conn.execute(db.expired(swept, jobs.c.finished_at, older_than_s, limit)).scalars())
    if doomed:
        conn.execute(attempts.delete().where(attempts.c.job_id.in_(doomed)))
        conn.execute(jobs.delete().where(jobs.c.id.in_(doomed)))
    return len(doomed)
