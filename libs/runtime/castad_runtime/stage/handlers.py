"""What a stage service does with each event it consumes, each in one transaction with its inbox row.

- its trigger (the previous stage's `completed`, or `pipeline.requested`): the pipeline's job;
- `pipeline.cancel_requested`: the job canceled, or, before the trigger came, prevented;
- `pipeline.retry_requested`: the job reopened with a fresh budget, where the pipeline resumes;
- `outbox.republish_requested`: a row of this service's outbox that the relay parked handed back;
- `provider.<stage>.called_back`: the provider says the job's work moved on: its poll is due now;
- `pipeline.review_decided`, in a stage that drafts for a review: a person's decision on its draft.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import sqlalchemy as sa
from castad_contracts import envelope as envelope_
from castad_contracts import events

from castad_runtime import consumer, inbox, outbox
from castad_runtime import metrics as metrics_
from castad_runtime.stage import faults as faults_
from castad_runtime.stage import reviews
from castad_runtime.stage import runner as runner_
from castad_runtime.stage.repository import polls

T = TypeVar("T")


class Slots(Protocol):
    """Where the handlers hand due work (castad_runtime.stage.scheduler.JobScheduler)."""

    def wake(self) -> None: ...
    def reserve(self) -> bool: ...
    def release(self) -> None: ...
    def run_claimed(self, claim: runner_.Claim) -> None: ...


class WakeOnly:
    """Slots that only say work is due: every job is left for a scheduler to claim."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake

    def reserve(self) -> bool:
        return False

    def release(self) -> None:
        raise AssertionError("nothing was reserved")

    def run_claimed(self, claim: runner_.Claim) -> None:
        raise AssertionError("nothing was reserved")


class StageHandlers:
    def __init__(
        self,
        engine: sa.Engine,
        runner: runner_.StageRunner,
        scheduler: Slots,
        faults: faults_.FaultInjector | None = None,
        metrics: metrics_.ConsumerMetrics | None = None,
        drafts: reviews.Reviews | None = None,
    ) -> None:
        self.engine = engine
        self.drafts = drafts
        self.runner = runner
        self.scheduler = scheduler
        self.wake: Callable[[], None] = scheduler.wake  # a job is due
        self.faults = faults
        self.metrics = metrics or metrics_.ConsumerMetrics(metrics_.registry(), runner.stage.value)

    def table(self, trigger: str) -> dict[str, consumer.Handler]:
        return {
            trigger: self.on_trigger,
            events.provider_called_back(self.runner.stage): self.on_called_back,
            events.PIPELINE_CANCEL_REQUESTED: self.on_cancel,
            events.PIPELINE_RETRY_REQUESTED: self.on_retry,
            events.OUTBOX_REPUBLISH_REQUESTED: self.on_republish,
            **({events.PIPELINE_REVIEW_DECIDED: self.on_review_decided} if self.drafts is not None else {}),
        }

    def on_trigger(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        """Claim the job at once into a free slot of the scheduler, or leave it due for the scheduler.

        The claim takes no transaction of its own.
        """
        if self.faults is not None:
            self.faults.handler()
        reserved = self.runner.claims_at_trigger and self.scheduler.reserve()
        claims: list[runner_.Claim] = []
        began = self.runner.clock()  # before the transaction a claim's lease would start in

        def accept(conn: sa.Connection) -> bool:
            due = self.runner.accept(conn, payload)
            claim = self.runner.claim_accepted(conn, payload.pipeline_id, began) if due and reserved else None
            if claim is not None:
                claims.append(claim)
            return due

        try:
            due = self._once(env, accept)
        except BaseException:
            for claim in claims:
                claim.abandon()
            if reserved:
                self.scheduler.release()
            raise
        if claims:
            self.scheduler.run_claimed(claims[0])
            return
        if reserved:
            self.scheduler.release()
        if due:
            self.wake()

    def on_cancel(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        assert isinstance(payload, events.PipelineCancelRequested)
        running = self._once(env, lambda conn: self.runner.apply_cancel(conn, payload))
        if running is not None:
            self.runner.cancel_local(running)

    def on_retry(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        assert isinstance(payload, events.PipelineRetryRequested)
        if self._once(env, lambda conn: self.runner.apply_retry(conn, payload)):
            self.wake()

    def on_called_back(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        if self._once(env, lambda conn: polls.poll_now(conn, payload.pipeline_id)):
            self.wake()

    def on_review_decided(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        assert isinstance(payload, events.PipelineReviewDecided) and self.drafts is not None
        drafts = self.drafts
        edited = drafts.edited(payload)
        if self._once(env, lambda conn: drafts.decide(conn, payload, edited)):
            self.wake()

    def on_republish(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        assert isinstance(payload, events.OutboxRepublishRequested)
        self._once(env, lambda conn: outbox.republish(conn, [payload.event_id]))

    def _once(self, env: envelope_.Envelope, step: Callable[[sa.Connection], T]) -> T | None:
        return inbox.once(self.engine, env, step, seen_again=self.metrics.duplicate)
