"""Polls of work waiting at a provider made in batches by the prober, on a real PostgreSQL.

A batch is claimed in one transaction and recorded in one; work not had yet is due again, work done or failed is
made ready and a claim of the runner then polls it once more and completes it; a callback or a cancel during a
batch wins; the provider's quota pays for every poll of a batch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from castad_contracts import codes
from castad_runtime import db, metrics, tables
from castad_runtime.stage import errors, machine, probes, remote, runner
from castad_runtime.stage.repository import polls

from tests.integration.test_remote_jobs import (
    FAST,
    Provider,
    fresh_provider,
    quota_row,
    remote_runner,
    status_of,
    turn,
)
from tests.integration.test_stage_runner import add_job, attempt_rows, emitted, job_row
from tests.support import waits

pytestmark = pytest.mark.integration

Status = machine.Status


@pytest.fixture
def engine(engines: Mapping[str, sa.Engine]) -> sa.Engine:
    return engines["lyric"]


def probed_runner(
    engine: sa.Engine, api: Provider, schedule: remote.PollSchedule = FAST, **kwargs: Any
) -> runner.StageRunner:
    stage = remote_runner(engine, api, schedule, **kwargs)
    stage.probed = True
    return stage


def prober(stage: runner.StageRunner, provider: str | None = None, **kwargs: Any) -> probes.Prober:
    assert isinstance(stage.work, remote.RemoteWork)
    values: dict[str, Any] = {"batch": 100, "threads": 4, "lease_s": 30.0, "timeout_s": 30.0, **kwargs}
    return probes.Prober(stage.engine, stage.work.probe, provider=provider, **values)


def submitted(stage: runner.StageRunner, count: int) -> list[str]:
    """`count` jobs whose work is at the provider (AWAITING), each submitted by a claim of its own."""
    pipelines = [add_job(stage) for _ in range(count)]
    for pipeline_id in pipelines:
        while job_row(stage.engine, pipeline_id).status != Status.AWAITING:
            assert turn(stage) is not None
    return pipelines


def due_now(engine: sa.Engine, pipelines: list[str]) -> None:
    """Their polls due at once, without waiting out the schedule."""
    jobs = tables.jobs
    with db.transaction(engine) as conn:
        conn.execute(
            jobs.update()
            .where(jobs.c.pipeline_id.in_(pipelines), jobs.c.status == Status.AWAITING)
            .values(due_at=sa.func.now() - sa.text("interval '1 millisecond'"))
        )


def probe_until(ask: probes.Prober, engine: sa.Engine, pipelines: list[str], done: Any) -> None:
    """Turns of the prober until every job is as `done` says (other tests' leftovers may be in its batches)."""
    waits.until(lambda: ask.turn() >= 0 and all(done(job_row(engine, p)) for p in pipelines), timeout_s=10.0)


def ready(row: Any) -> bool:
    return row.status == Status.AWAITING and row.due_at <= row.submitted_at


def test_a_batch_of_polls_is_one_claim_and_one_record_and_the_runner_completes_the_ready_ones(engine):
    api = Provider(*[remote.Pending("PENDING")] * 12)
    stage = probed_runner(engine, api)
    pipelines = submitted(stage, 12)
    api.polled.clear()
    measured = metrics.StageMetrics(metrics.registry(), "lyric")
    ask = prober(stage, metrics=measured)

    due_now(engine, pipelines)
    probe_until(ask, engine, pipelines, lambda row: row.polls == 1)
    for pipeline_id in pipelines:
        row = job_row(engine, pipeline_id)
        assert row.status == Status.AWAITING and row.due_at > row.submitted_at and row.lease_owner is None

    due_now(engine, pipelines)
    probe_until(ask, engine, pipelines, ready)  # the provider is done with each
    for _ in pipelines:
        assert turn(stage) is not None

    for pipeline_id in pipelines:
        assert job_row(engine, pipeline_id).status == Status.SUCCEEDED
        assert [a.outcome for a in attempt_rows(engine, pipeline_id)] == ["succeeded"]
        assert [kind for kind, _ in emitted(engine, pipeline_id)].count("lyric.completed") == 1
    handles = {job_row(engine, p).previous_handle or "" for p in pipelines}
    assert all(api.polled.count(h) == 3 for h in handles if h)  # two probes, and the claim's own poll
    later = measured.registry.get_sample_value("castad_probes_total", {"stage": "lyric", "outcome": "later"})
    assert later is not None and later >= 12


def test_a_claim_takes_a_waiting_job_only_once_it_is_ready(engine):
    api = Provider()  # done at the first poll
    stage = probed_runner(engine, api)
    (pipeline_id,) = submitted(stage, 1)
    due_now(engine, [pipeline_id])

    for _ in range(20):  # every claim finds other work or none: never this job, whose poll is the prober's
        claim = stage.claim_next()
        if claim is None:
            break
        assert claim.job.pipeline_id != pipeline_id
        stage.execute(claim)
    assert job_row(engine, pipeline_id).status == Status.AWAITING

    with db.transaction(engine) as conn:
        assert polls.poll_now(conn, pipeline_id)  # a callback makes it ready
    waits.until(lambda: turn(stage) and job_row(engine, pipeline_id).status == Status.SUCCEEDED, timeout_s=5.0)


def claimed_by_a_batch(engine: sa.Engine) -> tuple[str, polls.Probe]:
    """A job waiting at its provider, claimed by a batch of probes (with whatever else of other tests is due)."""
    stage = probed_runner(engine, Provider(remote.Pending("PENDING")))
    (pipeline_id,) = submitted(stage, 1)
    due_now(engine, [pipeline_id])
    handle = job_row(engine, pipeline_id).handle
    with db.transaction(engine) as conn:
        (claimed,) = [job for job in polls.claim_probes(conn, 1000, 30.0) if job.handle == handle]
    return pipeline_id, claimed


def test_a_callback_during_a_batch_wins_over_what_the_batch_found(engine):
    pipeline_id, claimed = claimed_by_a_batch(engine)
    with db.transaction(engine) as conn:
        assert polls.poll_now(conn, pipeline_id)
        assert polls.record_probes(conn, [polls.Probed(claimed, ready=False, wait_s=3600.0)]) == 0

    row = job_row(engine, pipeline_id)
    assert ready(row) and row.polls == 0


def test_a_cancel_during_a_batch_wins(engine):
    pipeline_id, claimed = claimed_by_a_batch(engine)
    with db.transaction(engine) as conn:
        conn.execute(
            tables.jobs.update().where(tables.jobs.c.pipeline_id == pipeline_id).values(status=Status.CANCELED)
        )
        assert polls.record_probes(conn, [polls.Probed(claimed, ready=True)]) == 0
    assert job_row(engine, pipeline_id).status == Status.CANCELED


def test_every_poll_of_a_batch_takes_a_token_of_the_providers_quota(engine):
    name = fresh_provider(engine, max_rate_per_s=0.01, min_rate_per_s=0.01, burst=4.0)
    api = Provider(*[remote.Pending("PENDING")] * 10)
    stage = probed_runner(engine, api)
    pipelines = submitted(stage, 10)
    api.polled.clear()
    due_now(engine, pipelines)

    ask = prober(stage, provider=name)
    assert ask.turn() == 4  # the bucket's four tokens, one a poll
    assert ask.turn() == 0  # nothing left: no claim
    assert len(api.polled) == 4 and quota_row(engine, name)["tokens"] < 1


def test_while_work_is_due_for_the_runner_the_prober_leaves_it_half_the_tokens(engine):
    name = fresh_provider(engine, max_rate_per_s=0.01, min_rate_per_s=0.01, burst=4.0)
    api = Provider(*[remote.Pending("PENDING")] * 10)
    stage = probed_runner(engine, api)
    pipelines = submitted(stage, 10)
    jobs = tables.jobs
    with db.transaction(engine) as conn:  # other tests' jobs in this database out of the way: tokens are counted
        conn.execute(
            jobs.update()
            .where(jobs.c.pipeline_id.not_in(pipelines), jobs.c.status.in_(list(machine.CLAIMABLE)))
            .values(due_at=sa.func.now() + sa.text("interval '1 day'"), submitted_at=sa.func.now())
        )
    due_now(engine, pipelines[1:])
    with db.transaction(engine) as conn:
        assert polls.poll_now(conn, pipelines[0])  # done, the provider called back: the runner's to complete
    api.polls = []  # the runner's poll finds it done
    stage.provider = name

    assert prober(stage, provider=name).turn() == 2  # half of the four tokens
    waits.until(lambda: turn(stage) and job_row(engine, pipelines[0]).status == Status.SUCCEEDED, timeout_s=5.0)
    assert quota_row(engine, name)["tokens"] == pytest.approx(1.0, abs=0.1)


def test_too_many_throttles_the_quota_and_a_failure_on_the_way_is_asked_again_later(engine):
    name = fresh_provider(engine)
    api = Provider(
        errors.ProviderError(codes.ErrorCode.PROVIDER_RATE_LIMITED, "429", retry_after_s=60.0),
    )
    stage = probed_runner(engine, api)
    (pipeline_id,) = submitted(stage, 1)
    handle = job_row(engine, pipeline_id).handle
    api.polls = [errors.ProviderError(codes.ErrorCode.PROVIDER_RATE_LIMITED, "429", retry_after_s=60.0)]
    due_now(engine, [pipeline_id])

    ask = prober(stage, provider=name)
    waits.until(lambda: ask.turn() >= 0 and handle in api.polled, timeout_s=5.0)
    row = job_row(engine, pipeline_id)
    assert row.status == Status.AWAITING and not ready(row) and row.counted_attempts == 0
    assert (row.due_at - row.updated_at).total_seconds() >= 59
    state = quota_row(engine, name)
    assert state["throttled"] == 1 and state["blocked_until"] is not None
    assert ask.turn() == 0  # blocked: nothing is asked before its Retry-After


def test_work_the_provider_failed_is_made_ready_and_its_claim_fails_the_attempt(engine):
    api = Provider(remote.Pending("PENDING"))
    stage = probed_runner(engine, api)
    (pipeline_id,) = submitted(stage, 1)
    handle = job_row(engine, pipeline_id).handle
    api.failed[handle] = errors.ProviderError(codes.ErrorCode.PROVIDER_JOB_FAILED, "the song failed", retryable=True)
    due_now(engine, [pipeline_id])

    probe_until(prober(stage), engine, [pipeline_id], ready)
    waits.until(lambda: turn(stage) and job_row(engine, pipeline_id).status != Status.AWAITING, timeout_s=5.0)
    (attempt, *_) = attempt_rows(engine, pipeline_id)
    assert attempt.outcome == "failed_retryable" and attempt.error_code == codes.ErrorCode.PROVIDER_JOB_FAILED


def test_work_waited_past_its_give_up_time_is_made_ready_without_asking(engine):
    api = Provider(remote.Pending("PENDING"))
    stage = probed_runner(engine, api, remote.PollSchedule(first_s=0.05, max_s=0.2, give_up_s=0.5))
    (pipeline_id,) = submitted(stage, 1)
    handle = job_row(engine, pipeline_id).handle
    time.sleep(0.6)
    api.polled.clear()

    probe_until(prober(stage), engine, [pipeline_id], ready)
    assert handle not in api.polled
    waits.until(lambda: turn(stage) and job_row(engine, pipeline_id).status != Status.AWAITING, timeout_s=5.0)
    (attempt, *_) = attempt_rows(engine, pipeline_id)
    assert attempt.error_code == codes.ErrorCode.PROVIDER_JOB_TIMEOUT


def test_a_stopping_prober_cancels_its_polls_and_leaves_their_jobs_due(engine):
    class Slow(Provider):
        def poll(self, handle, cancel):
            cancel.sleep(30.0)
            return super().poll(handle, cancel)

    api = Slow(remote.Pending("PENDING"))
    stage = probed_runner(engine, api)
    (pipeline_id,) = submitted(stage, 1)
    due_now(engine, [pipeline_id])
    ask = prober(stage)
    ask.start()
    waits.until(lambda: not_due(engine, pipeline_id), timeout_s=5.0, what="the batch's claim")
    began = time.monotonic()
    ask.stop()

    assert time.monotonic() - began < 10
    row = job_row(engine, pipeline_id)
    assert row.status == Status.AWAITING and row.due_at <= db_now(engine)
    assert row.polls == 0  # the provider never answered: the schedule's wait does not grow


def test_a_poll_that_hangs_past_its_time_is_cancelled_and_its_job_made_ready_for_a_claim(engine):
    class Hanging(Provider):
        def poll(self, handle, cancel):
            cancel.sleep(None)  # until cancelled
            return super().poll(handle, cancel)

    stage = probed_runner(engine, Hanging())
    (pipeline_id,) = submitted(stage, 1)
    due_now(engine, [pipeline_id])
    ask = prober(stage, timeout_s=0.5)
    ask.start()
    try:
        waits.until(lambda: ready(job_row(engine, pipeline_id)), timeout_s=10.0, what="the hung poll cancelled")
    finally:
        ask.stop()
    assert job_row(engine, pipeline_id).polls == 0


def test_a_fault_raised_around_a_poll_makes_its_job_ready_for_a_claim(engine):
    def faulty(job: polls.Probe, cancel: Any) -> remote.Later | None:
        raise errors.ProviderError(codes.ErrorCode.INJECTED_FAULT, "fault injected")

    stage = probed_runner(engine, Provider())  # done: its own answer to the claim's poll
    (pipeline_id,) = submitted(stage, 1)
    due_now(engine, [pipeline_id])
    ask = probes.Prober(engine, faulty, provider=None, batch=10, threads=1, lease_s=30.0, timeout_s=30.0)

    probe_until(ask, engine, [pipeline_id], ready)
    turn(stage)  # the claim polls the provider itself
    assert status_of(engine, pipeline_id) is Status.SUCCEEDED


def not_due(engine: sa.Engine, pipeline_id: str) -> bool:
    return job_row(engine, pipeline_id).due_at > db_now(engine)


def db_now(engine: sa.Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.now())).scalar_one()
