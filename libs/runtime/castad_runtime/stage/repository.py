"""Every SQL statement on the jobs and attempts tables."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from castad_runtime import db, tables
from castad_runtime.stage import machine, quota

jobs = tables.jobs
attempts = tables.attempts
CANCELED_CODE = "canceled"


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

    @property
    def polling(self) -> bool:
        """The attempt has submitted its work to a provider: this claim asks how it goes."""
        return self.handle is not None


_JOB_COLUMNS = (
    jobs.c.id,
    jobs.c.pipeline_id,
    jobs.c.status,
    jobs.c.version,
    jobs.c.attempts,
    jobs.c.counted_attempts,
    jobs.c.max_attempts,
    jobs.c.input,
    jobs.c.traceparent,
    jobs.c.tracestate,
    jobs.c.handle,
    jobs.c.submitted_at,
    jobs.c.polls,
    sa.func.coalesce(sa.func.extract("epoch", sa.func.now() - jobs.c.submitted_at), 0).label("waited_s"),
)


def _job(row: Any) -> Job:
    values = dict(row._mapping)
    values["status"] = machine.Status(values["status"])
    values["waited_s"] = float(values["waited_s"])
    return Job(**values)


def accept_trigger(
    conn: sa.Connection,
    pipeline_id: str,
    job_input: dict[str, Any],
    max_attempts: int,
    traceparent: str | None,
    tracestate: str | None,
) -> bool:
    """Record the stage's trigger: a PENDING job, due now. A job reopened by a retry before its trigger
    came (WAITING) becomes PENDING; a job canceled before its trigger came keeps it for a later retry.
    True if a job is now due."""
    insert = pg.insert(jobs).values(
        id=uuid.uuid4(),
        pipeline_id=pipeline_id,
        status=machine.Status.PENDING,
        max_attempts=max_attempts,
        due_at=sa.func.now(),
        input=job_input,
        traceparent=traceparent,
        tracestate=tracestate,
    )
    upsert = insert.on_conflict_do_update(
        index_elements=[jobs.c.pipeline_id],
        set_={
            "input": insert.excluded.input,
            "traceparent": insert.excluded.traceparent,
            "tracestate": insert.excluded.tracestate,
            "status": sa.case((jobs.c.status == machine.Status.WAITING, machine.Status.PENDING), else_=jobs.c.status),
            "due_at": sa.func.now(),
            "version": jobs.c.version + 1,
            "updated_at": sa.func.now(),
        },
        where=jobs.c.input.is_(None),
    )
    return conn.execute(upsert.returning(jobs.c.status)).scalar() == machine.Status.PENDING


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
        last_error_code=CANCELED_CODE,
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
            id=uuid.uuid4(),
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
            last_error_code=CANCELED_CODE,
            last_error_message=reason,
            handle=None,
            finished_at=sa.func.now(),
            updated_at=sa.func.now(),
        )
    )
    if held.status in (machine.Status.RUNNING, machine.Status.AWAITING):
        conn.execute(
            attempts.update()
            .where(attempts.c.job_id == held.id, attempts.c.number == held.attempts, attempts.c.outcome == "running")
            .values(finished_at=sa.func.now(), outcome="canceled", error_code=CANCELED_CODE, error_message=reason)
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


def claim_next(conn: sa.Connection, worker: str, lease_s: float, provider: str | None = None) -> Job | None:
    """Compare-and-set the most overdue claimable job to RUNNING under a lease, and open its attempt
    (a job AWAITING its provider goes on with the attempt that submitted its work).

    `provider`: claims call this provider, within its quota: none while its rate is spent or it asked
    to wait, and no new attempt while as many jobs as it allows are at it."""
    claimable = machine.CLAIMABLE
    if provider is not None:
        gate = quota.gate(conn, provider)
        if not gate.open:
            return None
        if not gate.new_work:
            claimable = frozenset({machine.Status.AWAITING})
    due = (
        sa.select(jobs.c.id)
        .where(jobs.c.status.in_(list(claimable)), jobs.c.due_at <= sa.func.now())
        .order_by(jobs.c.due_at)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    row = conn.execute(
        jobs.update()
        .where(jobs.c.id == due, jobs.c.status.in_(list(machine.CLAIMABLE)))
        .values(
            status=machine.Status.RUNNING,
            version=jobs.c.version + 1,
            attempts=sa.case((jobs.c.status == machine.Status.AWAITING, jobs.c.attempts), else_=jobs.c.attempts + 1),
            lease_owner=worker,
            lease_expires_at=db.seconds_from_now(lease_s),
            updated_at=sa.func.now(),
        )
        .returning(*_JOB_COLUMNS)
    ).first()
    if row is None:
        return None
    job = _job(row)
    if not job.polling:
        conn.execute(attempts.insert().values(job_id=job.id, number=job.attempts, worker=worker, outcome="running"))
    if provider is not None:
        quota.spend(conn, provider)
    return job


def renew_lease(conn: sa.Connection, job: Job, lease_s: float) -> bool:
    """Heartbeat: extend the lease while this claim is still the current one."""
    result = conn.execute(
        jobs.update()
        .where(jobs.c.id == job.id, jobs.c.version == job.version, jobs.c.status == machine.Status.RUNNING)
        .values(lease_expires_at=db.seconds_from_now(lease_s))
    )
    return result.rowcount == 1


def expired_leases(conn: sa.Connection, limit: int, exclude: Collection[uuid.UUID] = ()) -> list[Job]:
    """RUNNING jobs whose lease ran out, but for `exclude` (attempts this process is still running:
    after an outage longer than the lease, their heartbeat renews them, or their finish records them)."""
    query = (
        sa.select(*_JOB_COLUMNS)
        .where(jobs.c.status == machine.Status.RUNNING, jobs.c.lease_expires_at < sa.func.now())
        .order_by(jobs.c.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    if exclude:
        query = query.where(jobs.c.id.not_in(list(exclude)))
    return [_job(row) for row in conn.execute(query)]


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
    values: dict[str, Any] = {
        "status": status,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": sa.func.now(),
    }
    if counted:
        values["counted_attempts"] = job.counted_attempts + 1
    if status is not machine.Status.AWAITING:  # whatever was submitted is done with
        values.update(handle=None, submitted_at=None, polls=0)
    if status is machine.Status.RETRY_WAIT:
        values["due_at"] = db.seconds_from_now(retry_in_s)
    if status.terminal:
        values["finished_at"] = sa.func.now()
    if result is not None:
        values["result"] = result
    if error_code is not None:
        values["last_error_code"] = error_code
        values["last_error_message"] = error_message
    updated = conn.execute(
        jobs.update()
        .where(jobs.c.id == job.id, jobs.c.version == job.version, jobs.c.status == machine.Status.RUNNING)
        .values(**values)
    )
    if updated.rowcount != 1:
        return False
    conn.execute(
        attempts.update()
        .where(attempts.c.job_id == job.id, attempts.c.number == job.attempts)
        .values(finished_at=sa.func.now(), outcome=outcome, error_code=error_code, error_message=error_message)
    )
    return True


def await_provider(conn: sa.Connection, job: Job, handle: str, poll_in_s: float) -> bool:
    """The attempt's work is at the provider under `handle` (just submitted, or still unfinished):
    the job waits without a worker until a poll is due. CAS on version, like finish_attempt."""
    machine.check_transition(job.status, machine.Status.AWAITING)
    values: dict[str, Any] = {
        "status": machine.Status.AWAITING,
        "lease_owner": None,
        "lease_expires_at": None,
        "handle": handle,
        "due_at": db.seconds_from_now(poll_in_s),
        "updated_at": sa.func.now(),
    }
    if job.polling:
        values["polls"] = jobs.c.polls + 1
    else:
        values.update(submitted_at=sa.func.now(), polls=0)
    updated = conn.execute(
        jobs.update()
        .where(jobs.c.id == job.id, jobs.c.version == job.version, jobs.c.status == machine.Status.RUNNING)
        .values(**values)
    )
    return updated.rowcount == 1


def poll_now(conn: sa.Connection, pipeline_id: str) -> bool:
    """The provider says it is done (its callback): the job's poll is due at once. True if one was waiting."""
    updated = conn.execute(
        jobs.update()
        .where(jobs.c.pipeline_id == pipeline_id, jobs.c.status == machine.Status.AWAITING)
        .values(due_at=sa.func.least(jobs.c.due_at, jobs.c.submitted_at))  # ahead of polls merely due
    )
    return updated.rowcount == 1


def due_at(conn: sa.Connection, job_id: uuid.UUID) -> dt.datetime:
    return conn.execute(sa.select(jobs.c.due_at).where(jobs.c.id == job_id)).scalar_one()
