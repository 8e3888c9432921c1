"""The jobs that ended: their files swept, then the jobs forgotten (castad_runtime.stage.retention).

A job is forgotten with its attempts; one reopened by a retry since its files were swept is not.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Collection

import sqlalchemy as sa

from castad_runtime import db, tables

jobs = tables.jobs
attempts = tables.attempts


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
