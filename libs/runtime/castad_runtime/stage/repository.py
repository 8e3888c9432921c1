"""Every SQL statement on the jobs and attempts tables."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from castad_runtime import tables
from castad_runtime.stage import machine

jobs = tables.jobs
attempts = tables.attempts


@dataclasses.dataclass(frozen=True)
class Job:
    id: uuid.UUID
    pipeline_id: str
    status: machine.Status
    version: int
    attempts: int
    max_attempts: int
    input: dict[str, Any]
    traceparent: str | None
    tracestate: str | None


_JOB_COLUMNS = (
    jobs.c.id,
    jobs.c.pipeline_id,
    jobs.c.status,
    jobs.c.version,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.input,
    jobs.c.traceparent,
    jobs.c.tracestate,
)


def _job(row: Any) -> Job:
    values = dict(row._mapping)
    values["status"] = machine.Status(values["status"])
    return Job(**values)


def _seconds(value: float) -> sa.ColumnElement[dt.datetime]:
    return sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.literal(value, sa.Float))


def create(
    conn: sa.Connection,
    pipeline_id: str,
    job_input: dict[str, Any],
    max_attempts: int,
    traceparent: str | None,
    tracestate: str | None,
) -> uuid.UUID | None:
    """A PENDING job, due now; None if this pipeline already has one."""
    return conn.execute(
        pg.insert(jobs)
        .values(
            id=uuid.uuid4(),
            pipeline_id=pipeline_id,
            status=machine.Status.PENDING,
            max_attempts=max_attempts,
            due_at=sa.func.now(),
            input=job_input,
            traceparent=traceparent,
            tracestate=tracestate,
        )
        .on_conflict_do_nothing(index_elements=[jobs.c.pipeline_id])
        .returning(jobs.c.id)
    ).scalar()


def claim_next(conn: sa.Connection, worker: str, lease_s: float) -> Job | None:
    """Compare-and-set the most overdue claimable job to RUNNING under a lease, and open its attempt."""
    due = (
        sa.select(jobs.c.id)
        .where(jobs.c.status.in_(list(machine.CLAIMABLE)), jobs.c.due_at <= sa.func.now())
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
            attempts=jobs.c.attempts + 1,
            lease_owner=worker,
            lease_expires_at=_seconds(lease_s),
            updated_at=sa.func.now(),
        )
        .returning(*_JOB_COLUMNS)
    ).first()
    if row is None:
        return None
    job = _job(row)
    conn.execute(attempts.insert().values(job_id=job.id, number=job.attempts, worker=worker, outcome="running"))
    return job


def renew_lease(conn: sa.Connection, job: Job, lease_s: float) -> bool:
    """Heartbeat: extend the lease while this claim is still the current one."""
    result = conn.execute(
        jobs.update()
        .where(jobs.c.id == job.id, jobs.c.version == job.version, jobs.c.status == machine.Status.RUNNING)
        .values(lease_expires_at=_seconds(lease_s))
    )
    return result.rowcount == 1


def expired_leases(conn: sa.Connection, limit: int) -> list[Job]:
    rows = conn.execute(
        sa.select(*_JOB_COLUMNS)
        .where(jobs.c.status == machine.Status.RUNNING, jobs.c.lease_expires_at < sa.func.now())
        .order_by(jobs.c.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
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
) -> bool:
    """Move a RUNNING job on, only if `job` is still the current claim (CAS on version)."""
    machine.check_transition(job.status, status)
    values: dict[str, Any] = {
        "status": status,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": sa.func.now(),
    }
    if status is machine.Status.RETRY_WAIT:
        values["due_at"] = _seconds(retry_in_s)
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


def due_at(conn: sa.Connection, job_id: uuid.UUID) -> dt.datetime:
    return conn.execute(sa.select(jobs.c.due_at).where(jobs.c.id == job_id)).scalar_one()
