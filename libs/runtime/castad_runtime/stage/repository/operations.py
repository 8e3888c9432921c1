"""An operator's requests on a stage's job: its cancel, or its retry (a reopened job with a fresh budget).

The job is locked first, so that the pipeline's requests are taken in their order (castad_runtime.stage.runner
checks it); a job with no row yet gets one without its input, for the trigger to find. A running attempt ends
with its cancel (castad_runtime.stage.repository.attempts).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import sqlalchemy as sa
from castad_contracts import codes, ids
from sqlalchemy.dialects import postgresql as pg

from castad_runtime import tables
from castad_runtime.stage import machine
from castad_runtime.stage.repository import attempts

jobs = tables.jobs


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
        attempts.end_attempt(
            conn, held.id, held.attempts, "canceled", error_code=codes.ErrorCode.CANCELED, error_message=reason
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
