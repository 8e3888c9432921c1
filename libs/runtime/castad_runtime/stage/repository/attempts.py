"""An attempt's row: its work sent to its provider, fenced by its claim; its end; its wait at the provider.

The job moves on with its attempt, compare-and-set on the claim's version (a repository.Job from
castad_runtime.stage.repository.claiming): ended (FINISH_ATTEMPT), or AWAITING its provider until a poll. The
requests for work an attempt sent are recorded before they leave (castad_runtime.stage.fence), and told by the
attempt's next event (castad_runtime.stage.runner).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from psycopg.types.json import Jsonb

from castad_runtime import db, tables
from castad_runtime.stage import machine, repository

jobs = tables.jobs
attempts = tables.attempts

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


def finish_attempt(
    conn: sa.Connection,
    job: repository.Job,
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


def await_provider(
    conn: sa.Connection, job: repository.Job, handle: str, poll_in_s: float, notes: tuple[str, ...] = ()
) -> bool:
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


def end_attempt(conn: sa.Connection, job_id: uuid.UUID, number: int, outcome: str, **errors: str) -> None:
    """End the job's attempt `number` with `outcome`, if it is still running."""
    conn.execute(
        attempts.update()
        .where(attempts.c.job_id == job_id, attempts.c.number == number, attempts.c.outcome == "running")
        .values(finished_at=sa.func.now(), outcome=outcome, **errors)
    )


def record_submission(conn: sa.Connection, job: repository.Job, margin_s: float) -> float | None:
    """Record that the attempt's work leaves for the provider now, if its claim still holds.

    It is recorded on the attempt's row, under `job.submission_key`, if `job` is still the current claim and its
    lease has more than `margin_s` left by the database's clock: the seconds of lease left then. None: the claim
    does not hold (the work must not leave).
    """
    params = {"key": job.submission_key, "id": job.id, "version": job.version, "number": job.attempts}
    row = db.run(conn, RECORD_SUBMISSION, {**params, "margin_s": margin_s}).fetchone()
    return None if row is None else float(row.lease_left_s)


def unrecord_submission(conn: sa.Connection, job: repository.Job) -> None:
    """The submission recorded for this attempt did not leave after all."""
    conn.execute(
        attempts.update()
        .where(attempts.c.job_id == job.id, attempts.c.number == job.attempts)
        .values(submitted_at=None, submission_key=None, untold_calls=_ONE_CALL_FEWER)
    )


def refused_call(conn: sa.Connection, job: repository.Job) -> None:
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
