"""What a stage service deletes of its own, besides its outbox and inbox rows (castad_runtime.retention).

- The files of a finished job (SUCCEEDED, FAILED or CANCELED), CASTAD_RETENTION_ARTIFACTS_S after it
  finished: every file of its stage for its pipeline, the artifact and whatever a late attempt left.
  The next stage reads this stage's artifact while its pipeline runs, which is at most the gateway's
  deadline after its request or retry: the gateway's settings require artifacts to outlive that, and
  the gateway refuses a retry that would outlast them (castad_api.retention).
- The finished job and its attempts, CASTAD_RETENTION_JOBS_S after it finished, once its files are deleted.

A job that has not finished is never touched. The files are deleted outside any transaction (an
object store may be slow), then the job is marked, only if it has not ended again meanwhile (a retry
reopened it: its new files are deleted when it ends anew). Two replicas may delete the same files;
deleting twice is harmless.
"""

from __future__ import annotations

import sqlalchemy as sa
from castad_contracts import events

from castad_runtime import artifacts, retention, settings
from castad_runtime.stage.repository import ended

JOB_ROWS = 3  # a job and its attempts, about
FILE_LISTINGS = 20  # a job's files cost a listing and a deletion in the store: far fewer of them per batch


def steps(
    engine: sa.Engine, store: artifacts.ArtifactStore, stage: events.Stage, config: settings.CommonSettings
) -> list[retention.Step]:
    """The stage service's retention: outbox, inbox, files of finished jobs, finished jobs."""
    return [
        *retention.shared_steps(engine, config),
        retention.Step(
            "files of finished jobs",
            lambda limit: sweep(engine, store, stage, config.retention_artifacts_s, limit),
            rows_each=FILE_LISTINGS,
        ),
        retention.statement_step(
            "finished jobs",
            engine,
            lambda conn, limit: ended.forget_finished(conn, config.retention_jobs_s, limit),
            rows_each=JOB_ROWS,
        ),
    ]


def sweep(
    engine: sa.Engine, store: artifacts.ArtifactStore, stage: events.Stage, older_than_s: float, limit: int
) -> int:
    """Delete the files of up to `limit` jobs that finished more than `older_than_s` ago; how many jobs."""
    with retention.transaction(engine) as conn:
        finished = ended.unswept(conn, older_than_s, limit)
    for job in finished:
        store.delete(job.pipeline_id, stage)
    with retention.transaction(engine) as conn:
        ended.mark_swept(conn, finished)
    return len(finished)
