"""A draft a person decides on before the stage goes on: the stage that drafted owns the wait.

A pipeline whose brief asks for a review has its stage draft (the work returns `outcomes.Drafted`): the draft, its
`drafted` event and the job waiting in REVIEW are one transaction, and the job holds no worker while it waits,
due when its review times out. Then, once each, whatever is redelivered:

- a decision (`pipeline.review_decided`, which the gateway recorded) on the job's current draft, and on no other:
  approve and edit complete the job (an edit's words as the stage's output, exactly as written); regenerate makes it
  PENDING for a new draft, on an attempt that no failure counted;
- its timeout, which the stage's own scheduler finds (`expire_due`): the stage says `review_expired` and goes on
  waiting, saying so again every `ASK_AGAIN_S`, for the gateway's word. The gateway, which alone took decisions
  until then, settles it once: a decision it took in time is on its way and applies; without one, it sends the
  draft's approval, or cancels the pipeline, as `on_timeout` says (castad_api.decisions.settle_timed_out). So a
  decision taken in time is never overtaken by the timeout, however late the machinery brings it.

The pipeline's deadline does not run while its draft waits: the gateway stops it on `drafted` and starts it again
on the stage's next word.
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
from castad_runtime.stage import machine, outcomes, repository
from castad_runtime.stage import runner as runner_
from castad_runtime.stage.repository import drafts

log = logging.getLogger(__name__)

ASK_AGAIN_S = 3600.0  # a draft that timed out says so again this often until the gateway's word comes
EXPIRE_BATCH = 20
LOOK_S = 2.0  # how often timed-out drafts are looked for (a transaction of its own), less often than the poll

# Keeps a person's edit as the stage's output (its file kept): given the pipeline and the edited lyrics.
Edit = Callable[[str, events.Lyrics], outcomes.Output]


class Reviews:
    """A stage's drafts: the decisions on them, and their timeouts."""

    def __init__(self, runner: runner_.StageRunner, edit: Edit) -> None:
        self.runner = runner
        self.edit = edit
        self._next_look = 0.0

    def edited(self, decision: events.PipelineReviewDecided) -> outcomes.Output | None:
        """Before the decision's transaction: an edit's words kept as a file (None for any other decision)."""
        if decision.decision != "edit":
            return None
        assert decision.lyrics is not None  # the contract's: an edit names its lyrics
        return self.edit(decision.pipeline_id, decision.lyrics)

    def decide(
        self, conn: sa.Connection, decision: events.PipelineReviewDecided, edited: outcomes.Output | None
    ) -> bool:
        """In the handler's transaction: apply a person's decision to the job's current draft; True if a job is due."""
        job = drafts.lock_job(conn, decision.pipeline_id)
        current = (job.review or {}).get("draft_id") if job is not None else None
        if job is None or job.status is not machine.Status.REVIEW or current != decision.draft_id:
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
            drafts.review_again(conn, job, review, machine.Status.PENDING, 0.0)
            log.info("%s draft %s: a new one asked for", self.runner.stage.value, decision.draft_id)
            return True
        output = edited if edited is not None else drafted_output(job)
        self.runner.complete_review(conn, job, output, decided)
        log.info("%s draft %s: %s", self.runner.stage.value, decision.draft_id, decision.decision)
        return False

    def expire_due(self, limit: int = EXPIRE_BATCH) -> int:
        """Say of each draft whose review timed out that it did, for the gateway to settle; how many.

        At most every LOOK_S, unless the last look found a full batch."""
        if time.monotonic() < self._next_look:
            return 0
        with db.transaction(self.runner.engine) as conn:
            due = drafts.due_reviews(conn, limit)
            for job in due:
                with logs.bound(job.pipeline_id):
                    self._expire(conn, job)
        self._next_look = 0.0 if len(due) == limit else time.monotonic() + LOOK_S
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
        expired = {**review, "expired_at": review.get("expired_at", now.isoformat())}
        drafts.review_again(conn, job, expired, machine.Status.REVIEW, ASK_AGAIN_S)
        log.info("%s draft %s: its review timed out", self.runner.stage.value, review["draft_id"])


def drafted_output(job: repository.Job) -> outcomes.Output:
    """The output the job's current draft completes the stage with, as it was drafted."""
    assert job.review is not None
    return outcomes.Output(events.Artifact.model_validate(job.review["artifact"]), job.review["details"])
