"""A job whose draft waits for a person's review: drafted, locked for a decision, ended or drafted again.

What the review decides and when it times out: castad_runtime.stage.reviews. The attempt that drafted stays
open while the job is in REVIEW, and ends with the review (castad_runtime.stage.repository.attempts).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from castad_runtime import db, tables
from castad_runtime.stage import machine, repository
from castad_runtime.stage.repository import attempts

jobs = tables.jobs


def draft(conn: sa.Connection, job: repository.Job, review: dict[str, Any], wait_s: float) -> bool:
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


def lock_job(conn: sa.Connection, pipeline_id: str) -> repository.Job | None:
    """The pipeline's job, locked (None: there is none yet)."""
    row = conn.execute(
        sa.text(f"SELECT {_REVIEW_COLUMNS} FROM jobs WHERE pipeline_id = :pipeline_id FOR UPDATE"),
        {"pipeline_id": pipeline_id},
    ).fetchone()
    return None if row is None else repository.job_of(row)


def due_reviews(conn: sa.Connection, limit: int) -> list[repository.Job]:
    """Jobs whose draft's review timed out (jobs_review_due), locked; others skip them."""
    rows = conn.execute(
        sa.text(
            f"SELECT {_REVIEW_COLUMNS} FROM jobs WHERE status = 'REVIEW' AND due_at <= now()"
            " ORDER BY due_at LIMIT :limit FOR UPDATE SKIP LOCKED"
        ),
        {"limit": limit},
    ).fetchall()
    return [repository.job_of(row) for row in rows]


def end_review(conn: sa.Connection, job: repository.Job, review: dict[str, Any], result: dict[str, Any]) -> None:
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
    attempts.end_attempt(conn, job.id, job.attempts, "succeeded")


def review_again(
    conn: sa.Connection, job: repository.Job, review: dict[str, Any], status: machine.Status, due_in_s: float
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
        attempts.end_attempt(conn, job.id, job.attempts, REDRAFTED)
