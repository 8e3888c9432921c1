"""A stage's side of an operator's cancel and retry, on a real PostgreSQL.

The lyric stage's runner and handlers, as castad_runtime.stage.service wires them, get the
requests a gateway publishes (numbered per pipeline) and the pipeline's trigger in every order
they can come in.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from castad_contracts import envelope, events
from castad_runtime import consumer, db, tables
from castad_runtime.stage import cancellation, errors, handlers, outcomes, repository, runner

from tests.integration.helpers import output, pipeline_requested, stage_runner
from tests.support import waits

pytestmark = pytest.mark.integration


class Stage:
    """The lyric stage of the installation, driven event by event as its consumer would."""

    def __init__(self, engine: sa.Engine, work: runner.Work | None = None, **limits: Any) -> None:
        self.engine = engine
        self.runner = stage_runner(engine, work or (lambda job, cancel: output()), **limits)
        self.woken = 0
        self.handlers = handlers.StageHandlers(engine, self.runner, handlers.WakeOnly(self._wake))

    def _wake(self) -> None:
        self.woken += 1

    def trigger(self, pipeline_id: str) -> None:
        payload = pipeline_requested(pipeline_id)
        self.handlers.on_trigger(envelope.wrap(payload, events.PIPELINE_REQUESTED, "/castad/api"), payload)

    def cancel(self, pipeline_id: str, operation: int, reason: str = "not needed any more") -> None:
        payload = events.PipelineCancelRequested(pipeline_id=pipeline_id, operation=operation, reason=reason)
        self.handlers.on_cancel(envelope.wrap(payload, events.PIPELINE_CANCEL_REQUESTED, "/castad/api"), payload)

    def retry(self, pipeline_id: str, operation: int, stage: events.Stage = events.Stage.LYRIC, **budget: int) -> None:
        payload = events.PipelineRetryRequested(
            pipeline_id=pipeline_id,
            operation=operation,
            stage=stage,
            max_attempts={events.Stage(name): n for name, n in budget.items()} or None,
        )
        self.handlers.on_retry(envelope.wrap(payload, events.PIPELINE_RETRY_REQUESTED, "/castad/api"), payload)

    def run_due(self) -> None:
        claim = self.runner.claim_next()
        assert claim is not None
        self.runner.execute(claim)

    def job(self, pipeline_id: str) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(tables.jobs).where(tables.jobs.c.pipeline_id == pipeline_id)).one()

    def facts(self, pipeline_id: str) -> list[tuple[str, dict[str, Any]]]:
        o = tables.outbox
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(o.c.routing_key, o.c.envelope).where(o.c.pipeline_id == pipeline_id).order_by(o.c.id)
            )
            return [(row.routing_key.split(".", 1)[1], row.envelope["data"]) for row in rows]

    def attempts(self, pipeline_id: str) -> list[tuple[int, str]]:
        a, j = tables.attempts, tables.jobs
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(a.c.number, a.c.outcome).join(j, j.c.id == a.c.job_id).where(j.c.pipeline_id == pipeline_id)
            )
            return sorted((row.number, row.outcome) for row in rows)


@pytest.fixture
def stage(engines: Mapping[str, sa.Engine]) -> Stage:
    return Stage(engines["lyric"])


def test_a_cancel_before_the_trigger_means_the_stage_never_starts_the_job(stage):
    pipeline_id = str(uuid.uuid4())

    stage.cancel(pipeline_id, 1)
    stage.trigger(pipeline_id)

    job = stage.job(pipeline_id)
    assert (job.status, job.attempts, job.last_operation) == ("CANCELED", 0, 1)
    assert job.input is not None  # kept, should a retry come
    assert stage.runner.claim_next() is None and stage.woken == 0
    [(fact, canceled)] = stage.facts(pipeline_id)
    assert (fact, canceled["attempt"], canceled["operation"], canceled["reason"]) == (
        "canceled",
        0,
        1,
        "not needed any more",
    )


def test_a_pending_job_is_canceled_and_never_claimed(stage):
    pipeline_id = str(uuid.uuid4())
    stage.trigger(pipeline_id)

    stage.cancel(pipeline_id, 1)

    assert stage.job(pipeline_id).status == "CANCELED"
    assert stage.runner.claim_next() is None
    assert [fact for fact, _ in stage.facts(pipeline_id)] == ["canceled"]


def test_a_job_waiting_for_its_retry_is_canceled(engines):
    stage = Stage(
        engines["lyric"], work=lambda job, cancel: (_ for _ in ()).throw(errors.RetryableProviderError("x", "y"))
    )
    pipeline_id = str(uuid.uuid4())
    stage.trigger(pipeline_id)
    stage.run_due()
    assert stage.job(pipeline_id).status == "RETRY_WAIT"

    stage.cancel(pipeline_id, 1)

    assert stage.job(pipeline_id).status == "CANCELED"
    assert [fact for fact, _ in stage.facts(pipeline_id)] == ["started", "retrying", "canceled"]


def test_a_running_attempt_is_stopped_at_once_and_records_nothing_more(engines):
    entered, reasons = threading.Event(), []

    def long_call(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        entered.set()
        try:
            cancel.sleep(60)
        finally:
            reasons.append(cancel.reason)
        return output()

    stage = Stage(engines["lyric"], work=long_call)
    pipeline_id = str(uuid.uuid4())
    stage.trigger(pipeline_id)
    claim = stage.runner.claim_next()
    assert claim is not None
    attempt = threading.Thread(target=stage.runner.execute, args=(claim,))
    attempt.start()
    assert entered.wait(5)

    stage.cancel(pipeline_id, 1)
    attempt.join(5)

    assert not attempt.is_alive() and reasons == [cancellation.Reason.CANCELED]
    assert stage.job(pipeline_id).status == "CANCELED"
    assert stage.attempts(pipeline_id) == [(1, "canceled")]
    assert [fact for fact, _ in stage.facts(pipeline_id)] == ["started", "canceled"]


def test_a_finished_job_keeps_its_outcome_and_the_cancel_is_only_counted(stage):
    pipeline_id = str(uuid.uuid4())
    stage.trigger(pipeline_id)
    stage.run_due()

    stage.cancel(pipeline_id, 1)

    job = stage.job(pipeline_id)
    assert (job.status, job.last_operation) == ("SUCCEEDED", 1)
    assert [fact for fact, _ in stage.facts(pipeline_id)] == ["started", "completed"]


def test_a_request_ahead_of_an_earlier_one_is_held_until_that_one_came(stage):
    pipeline_id = str(uuid.uuid4())
    stage.trigger(pipeline_id)

    with pytest.raises(consumer.Hold, match="request 2 .* came before request 1"):
        stage.retry(pipeline_id, 2)
    assert stage.job(pipeline_id).last_operation == 0  # the held request changed nothing

    stage.cancel(pipeline_id, 1)
    stage.retry(pipeline_id, 2)

    job = stage.job(pipeline_id)
    assert (job.status, job.last_operation) == ("PENDING", 2)


def test_a_retry_reopens_a_failed_job_with_a_fresh_budget_and_carries_it_on(engines):
    def fails_for_good_once(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        if job.attempts == 1:
            raise errors.PermanentProviderError("bad", "cannot write these lyrics")
        return output()

    stage = Stage(engines["lyric"], work=fails_for_good_once)
    pipeline_id = str(uuid.uuid4())
    stage.trigger(pipeline_id)
    stage.run_due()
    assert stage.job(pipeline_id).status == "FAILED"

    stage.retry(pipeline_id, 1, lyric=7, song=9)

    job = stage.job(pipeline_id)
    assert (job.status, job.counted_attempts, job.max_attempts, job.attempts) == ("PENDING", 0, 7, 1)
    assert job.input["max_attempts"] == {"lyric": 7, "song": 9}
    assert stage.woken == 2  # the trigger, the retry
    stage.run_due()
    assert stage.attempts(pipeline_id) == [(1, "failed"), (2, "succeeded")]
    kind, completed = stage.facts(pipeline_id)[-1]
    assert (kind, completed["attempt"], completed["max_attempts"]) == ("completed", 2, {"lyric": 7, "song": 9})


def test_a_retry_of_a_job_canceled_before_its_trigger_waits_for_the_trigger(stage):
    pipeline_id = str(uuid.uuid4())
    stage.cancel(pipeline_id, 1)

    stage.retry(pipeline_id, 2)

    assert stage.job(pipeline_id).status == "WAITING"
    assert stage.runner.claim_next() is None
    stage.trigger(pipeline_id)
    assert stage.job(pipeline_id).status == "PENDING"
    stage.run_due()
    assert stage.job(pipeline_id).status == "SUCCEEDED"


def test_a_retry_for_a_later_stage_leaves_this_one_alone(stage):
    pipeline_id = str(uuid.uuid4())
    stage.trigger(pipeline_id)
    stage.run_due()

    stage.retry(pipeline_id, 1, stage=events.Stage.SONG)

    job = stage.job(pipeline_id)
    assert (job.status, job.attempts, job.last_operation) == ("SUCCEEDED", 1, 1)


def test_a_republish_request_hands_a_parked_row_of_this_outbox_back(stage):
    pipeline_id = str(uuid.uuid4())
    stage.trigger(pipeline_id)
    stage.run_due()
    o = tables.outbox
    with db.transaction(stage.engine) as conn:
        event_id = conn.execute(
            o.update()
            .where(o.c.pipeline_id == pipeline_id, o.c.routing_key == "lyric.completed")
            .values(parked_at=sa.func.now(), publish_attempts=10, last_error="returned by the broker: NO_ROUTE")
            .returning(o.c.event_id)
        ).scalar_one()
    payload = events.OutboxRepublishRequested(pipeline_id=pipeline_id, event_id=event_id)

    stage.handlers.on_republish(envelope.wrap(payload, events.OUTBOX_REPUBLISH_REQUESTED, "/castad/api"), payload)

    with stage.engine.connect() as conn:
        row = conn.execute(sa.select(o).where(o.c.event_id == event_id)).one()
    assert (row.parked_at, row.publish_attempts, row.last_error) == (None, 0, None)


def test_trigger_and_cancel_racing_leave_one_consistent_job(engines):
    """The trigger and the cancel handled at the same time on two threads, many times.

    Each pipeline ends with one job, CANCELED, with the trigger kept, and one canceled event.
    """
    stage = Stage(engines["lyric"])
    pipelines = [str(uuid.uuid4()) for _ in range(20)]

    for pipeline_id in pipelines:
        threads = [
            threading.Thread(target=stage.trigger, args=(pipeline_id,)),
            threading.Thread(target=stage.cancel, args=(pipeline_id, 1)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)

    for pipeline_id in pipelines:
        job = waits.until(lambda pipeline_id=pipeline_id: stage.job(pipeline_id))
        assert (job.status, job.input is not None) == ("CANCELED", True)
        assert [fact for fact, _ in stage.facts(pipeline_id)] == ["canceled"]
    assert stage.runner.claim_next() is None
