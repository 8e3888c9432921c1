"""A draft a person decides on before the stage goes on: the stage that drafted owns the wait.

A pipeline whose brief asks for a review has its stage draft (the work returns `runner.Drafted`): the draft, its
`drafted` event and the job waiting in REVIEW are one transaction, and the job holds no worker while it waits,
due when its review times out. Then, once each, whatever is redelivered:

- a decision (`pipeline.review_decided`, which the gateway recorded) on the job's current draft, and on no other:
  approve and edit complete the job (an edit's words as the stage's output, exactly as written); regenerate makes it
  PENDING for a new draft, on an attempt that no failure counted;
- its timeout, which the stage's own scheduler finds (`expire_due`), a grace after the review's end for a decision
  made in time still on its way: `review_expired` is said, then approve
  completes the job with the draft, and cancel leaves it waiting for the cancel the gateway asks for on that word
  (said again every `ASK_AGAIN_S` until it comes).

The pipeline's deadline does not run while its draft waits: the gateway stops it on `drafted` and starts it again
on the decision or the stage's next word.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from castad_contracts import events

from castad_runtime import db, logs
from castad_runtime.stage import machine, repository
from castad_runtime.stage import runner as runner_

log = logging.getLogger(__name__)

ASK_AGAIN_S = 3600.0  # a draft timed out to cancel says so again this often until the gateway's cancel comes
EXPIRE_BATCH = 20

# Keeps a person's edit as the stage's output (its file kept): given the pipeline and the edited lyrics.
Edit = Callable[[str, events.Lyrics], runner_.Output]


class Reviews:
    """A stage's drafts: the decisions on them, and their timeouts.

    `grace_s`: how long a decision made in time may still be on its way (the gateway takes none later than the
    draft's review): a draft's timeout comes that much after it (the runner's Limits.review_grace_s), and none comes
    until the service has consumed that long since its start (a decision queued while it was down comes first)."""

    def __init__(self, runner: runner_.StageRunner, edit: Edit, grace_s: float = 0.0) -> None:
        self.runner = runner
        self.edit = edit
        self._first_timeout_at = time.monotonic() + grace_s

    def edited(self, decision: events.PipelineReviewDecided) -> runner_.Output | None:
        """Before the decision's transaction: an edit's words kept as a file (None for any other decision)."""
        if decision.decision != "edit":
            return None
        assert decision.lyrics is not None  # the contract's: an edit names its lyrics
        return self.edit(decision.pipeline_id, decision.lyrics)

    def decide(
        self, conn: sa.Connection, decision: events.PipelineReviewDecided, edited: runner_.Output | None
    ) -> bool:
        """In the handler's transaction: apply a person's decision to the job's current draft; True if a job is due."""
        job = repository.lock_job(conn, decision.pipeline_id)
        current = (job.review or {}).get("draft_id") if job is not None else None
        timed_out = job is not None and "expired_at" in (job.review or {})  # said so: the gateway cancels
        if job is None or job.status is not machine.Status.REVIEW or current != decision.draft_id or timed_out:
            log.warning(
                "%s on draft %s left alone: the job is %s, its draft %s",
                decision.decision,
                decision.draft_id,
                job.status.value if job else "not here",
                current,
            )
            return False
        decided = {"decision": decision.decision, "by": decision.decided_by, "at": decision.decided_at.isoformat()}
        assert job.review is not None
        if decision.decision == "regenerate":
            review = {**job.review, "note": decision.note, "decided": decided}
            repository.review_again(conn, job, review, machine.Status.PENDING, 0.0)
            log.info("%s draft %s: a new one asked for", self.runner.stage.value, decision.draft_id)
            return True
        output = edited if edited is not None else drafted_output(job)
        self.runner.complete_review(conn, job, output, decided)
        log.info("%s draft %s: %s", self.runner.stage.value, decision.draft_id, decision.decision)
        return False

    def expire_due(self, limit: int = EXPIRE_BATCH) -> int:
        """The drafts whose review timed out, each as its `on_timeout` says; how many."""
        if time.monotonic() < self._first_timeout_at:
            return 0
        with db.transaction(self.runner.engine) as conn:
            due = repository.due_reviews(conn, limit)
            for job in due:
                with logs.bound(job.pipeline_id):
                    self._expire(conn, job)
        return len(due)

    def _expire(self, conn: sa.Connection, job: repository.Job) -> None:
        assert job.review is not None
        review: dict[str, Any] = job.review
        now = dt.datetime.now(dt.UTC)
        self.runner.emit(
            conn,
            job,
            "review_expired",
            events.StageReviewExpired,
            draft_id=review["draft_id"],
            on_timeout=review["on_timeout"],
            expired_at=now,
        )
        if review["on_timeout"] == "approve":
            decided = {"decision": "approve", "by": None, "at": now.isoformat(), "timed_out": True}
            self.runner.complete_review(conn, job, drafted_output(job), decided)
            log.info("%s draft %s: no decision in time, approved", self.runner.stage.value, review["draft_id"])
            return
        expired = {**review, "expired_at": review.get("expired_at", now.isoformat())}
        repository.review_again(conn, job, expired, machine.Status.REVIEW, ASK_AGAIN_S)
        log.info(
            "%s draft %s: no decision in time, the pipeline to cancel", self.runner.stage.value, review["draft_id"]
        )


def drafted_output(job: repository.Job) -> runner_.Output:
    """The output the job's current draft completes the stage with, as it was drafted."""
    assert job.review is not None
    return runner_.Output(events.Artifact.model_validate(job.review["artifact"]), job.review["details"])
