"""What a stage service does with each event it consumes, each in one transaction with its inbox row.

- its trigger (the previous stage's `completed`, or `pipeline.requested`): the pipeline's job;
- `pipeline.cancel_requested`: the job canceled, or, before the trigger came, prevented;
- `pipeline.retry_requested`: the job reopened with a fresh budget, where the pipeline resumes;
- `outbox.republish_requested`: a row of this service's outbox that the relay parked handed back;
- `provider.<stage>.called_back`: the provider says the job's work moved on: its poll is due now.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import sqlalchemy as sa
from castad_contracts import envelope as envelope_
from castad_contracts import events

from castad_runtime import consumer, db, inbox, outbox
from castad_runtime.stage import faults as faults_
from castad_runtime.stage import repository
from castad_runtime.stage import runner as runner_


class StageHandlers:
    def __init__(
        self,
        engine: sa.Engine,
        runner: runner_.StageRunner,
        wake: Callable[[], None],
        faults: faults_.FaultInjector | None = None,
    ) -> None:
        self.engine = engine
        self.runner = runner
        self.wake = wake  # the scheduler's: a job is due
        self.faults = faults

    def table(self, trigger: str) -> dict[str, consumer.Handler]:
        return {
            trigger: self.on_trigger,
            events.provider_called_back(self.runner.stage): self.on_called_back,
            events.PIPELINE_CANCEL_REQUESTED: self.on_cancel,
            events.PIPELINE_RETRY_REQUESTED: self.on_retry,
            events.OUTBOX_REPUBLISH_REQUESTED: self.on_republish,
        }

    def on_trigger(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        if self.faults is not None:
            self.faults.handler()
        with db.transaction(self.engine) as conn:
            due = inbox.first_delivery(conn, env) and self.runner.accept(conn, payload)
        if due:
            self.wake()

    def on_cancel(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        assert isinstance(payload, events.PipelineCancelRequested)
        running: uuid.UUID | None = None
        with db.transaction(self.engine) as conn:
            if inbox.first_delivery(conn, env):
                running = self.runner.apply_cancel(conn, payload)
        if running is not None:
            self.runner.cancel_local(running)

    def on_retry(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        assert isinstance(payload, events.PipelineRetryRequested)
        with db.transaction(self.engine) as conn:
            due = inbox.first_delivery(conn, env) and self.runner.apply_retry(conn, payload)
        if due:
            self.wake()

    def on_called_back(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        with db.transaction(self.engine) as conn:
            due = inbox.first_delivery(conn, env) and repository.poll_now(conn, payload.pipeline_id)
        if due:
            self.wake()

    def on_republish(self, env: envelope_.Envelope, payload: events.Payload) -> None:
        assert isinstance(payload, events.OutboxRepublishRequested)
        with db.transaction(self.engine) as conn:
            if inbox.first_delivery(conn, env):
                outbox.republish(conn, [payload.event_id])
