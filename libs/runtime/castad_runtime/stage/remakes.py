"""A remake: a pipeline made again from one of its stages on, the stages before it reusing their own output.

`pipeline.requested` of a remake names the pipeline it remakes and the first stage made again (`events.Remake`),
and each stage passes that on in its `completed`. A stage before the one made again calls no provider: it copies
its own output of the earlier pipeline (the file into the new pipeline's place, and what its `completed` said,
which `StageRunner` keeps in the job's result for this) and completes with it. The stage made again, and the ones
after it, run as for any pipeline. So each stage decides for itself, from the facts it is given; nothing runs a
stage for another.
"""

from __future__ import annotations

import shutil
from typing import Any

import sqlalchemy as sa
from castad_contracts import codes, events

from castad_runtime import artifacts, tables
from castad_runtime.stage import cancellation, errors, outcomes, repository, runner

GONE = codes.ErrorCode.REMAKE_SOURCE_GONE


def reusing(
    stage: events.Stage, engine: sa.Engine, store: artifacts.ArtifactStore, work: runner.Work, reads: type[Any]
) -> runner.Work:
    """`work`, but for a remake's stage before the one made again: a copy of its output of the remade pipeline.

    `reads`: the model of the stage's trigger this release reads."""

    def run(
        job: repository.Job, cancel: cancellation.Cancellation
    ) -> outcomes.Output | outcomes.Awaiting | outcomes.Drafted:
        remake = getattr(job.trigger(reads), "remake", None)
        if remake is None or events.STAGE_ORDER.index(stage) >= events.STAGE_ORDER.index(remake.stage):
            return work(job, cancel)
        return again(stage, engine, store, job, remake.of)

    return run


def again(
    stage: events.Stage, engine: sa.Engine, store: artifacts.ArtifactStore, job: repository.Job, of: str
) -> outcomes.Output:
    """The stage's output of pipeline `of`, its file copied into `job`'s pipeline's place; ProviderError if gone."""
    jobs = tables.jobs
    with engine.connect() as conn:
        made = conn.execute(sa.select(jobs.c.status, jobs.c.result).where(jobs.c.pipeline_id == of)).first()
    if made is None or made.status != "SUCCEEDED" or "details" not in (made.result or {}):
        raise errors.ProviderError(
            GONE, f"the {stage.value} stage has no output of pipeline {of} to reuse", retryable=False
        )
    kept = events.Artifact.model_validate(made.result["artifact"])
    suffix = "." + kept.uri.rsplit(".", 1)[-1] if "." in kept.uri.rsplit("/", 1)[-1] else ""
    try:
        with (
            store.local_copy(kept, of, stage) as source,
            store.scratch(job.pipeline_id, stage, job.attempts, suffix) as scratch,
        ):
            shutil.copyfile(source, scratch)
            copied = store.keep(scratch, job.pipeline_id, stage, kept.media_type)
    except artifacts.ArtifactMissing:
        gone = f"the {stage.value} file of pipeline {of} is no longer kept"
        raise errors.ProviderError(GONE, gone, retryable=False) from None
    return outcomes.Output(copied, dict(made.result["details"]))
