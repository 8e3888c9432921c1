"""Work at a submit-then-poll provider, on a real PostgreSQL.

The job waits as AWAITING with its handle and no worker, polls are claims of their own, a callback brings the poll
forward and only one claim completes the job; a provider's quota is shared through the database.

The provider here is a scripted RemoteApi (what it answers is not the point; the adapters have
their own contract tests against fake servers in tests/providers).
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from castad_contracts import codes, events
from castad_runtime import db, tables
from castad_runtime.stage import cancellation, errors, machine, outcomes, quota, remote, repository, runner
from castad_runtime.stage.repository import polls

from tests.integration.helpers import output, stage_runner
from tests.integration.test_stage_runner import add_job, attempt_rows, emitted, end_spans, job_row, race
from tests.support import waits

pytestmark = pytest.mark.integration

Status = machine.Status
FAST = remote.PollSchedule(first_s=0.05, max_s=0.2, give_up_s=60.0)


class Provider:
    """A provider that submits with a new handle each time and answers polls from a script.

    Each submit passes the attempt's fence as an adapter does (HttpProvider.submit); each poll takes the next
    answer of its script (then: done).
    """

    def __init__(self, *polls: remote.Pending | remote.Finished | Exception) -> None:
        self.polls = list(polls)
        self.submitted: list[tuple[str, str | None]] = []
        self.polled: list[str] = []
        self.failed: dict[str, Exception] = {}
        self.notes: tuple[str, ...] = ()
        self.meanwhile: Callable[[], object] | None = None  # what happens while a submit or a poll is out
        self._lock = threading.Lock()

    def submit(
        self, job: repository.Job, callback_url: str | None, cancel: cancellation.Cancellation
    ) -> remote.Submitted:
        cancel.leaving()
        if self.meanwhile is not None:
            self.meanwhile()
        with self._lock:
            handle = f"task-{len(self.submitted) + 1}"
            self.submitted.append((handle, callback_url))
        return remote.Submitted(handle, self.notes)

    def poll(self, handle: str, cancel: cancellation.Cancellation) -> remote.Pending | remote.Finished:
        if self.meanwhile is not None:
            self.meanwhile()
        with self._lock:
            self.polled.append(handle)
            if handle in self.failed:  # work the provider failed stays failed
                raise self.failed[handle]
            step = self.polls.pop(0) if self.polls else remote.Finished("http://provider.invalid/result")
            if isinstance(step, errors.ProviderError) and step.code in remote.GONE:
                self.failed[handle] = step
        if isinstance(step, Exception):
            raise step
        return step


def remote_runner(
    engine: sa.Engine, api: Provider, schedule: remote.PollSchedule = FAST, **kwargs: Any
) -> runner.StageRunner:
    work = remote.work(api, schedule, lambda job: f"http://gateway.invalid/cb/{job.pipeline_id}", lambda *_: output())
    return stage_runner(engine, work, **kwargs)


def turn(stage: runner.StageRunner) -> repository.Job | None:
    """One claim and its run, as a slot of the scheduler does it; the job claimed (None: nothing due)."""
    claim = stage.claim_next()
    if claim is None:
        return None
    stage.execute(claim)
    return claim.job


def turn_when_due(stage: runner.StageRunner, what: str = "a due poll") -> repository.Job:
    return waits.until(lambda: turn(stage), timeout_s=5.0, what=what)


def fresh_provider(engine: sa.Engine, **limits: Any) -> str:
    name = f"provider-{uuid.uuid4().hex[:8]}"
    values = {"max_rate_per_s": 100.0, "min_rate_per_s": 1.0, "burst": 100.0, **limits}
    with db.transaction(engine) as conn:
        quota.configure(conn, quota.Limits(provider=name, **values))
    return name


def quota_row(engine: sa.Engine, name: str) -> dict[str, Any]:
    with engine.connect() as conn:
        return quota.state(conn, name)


@pytest.fixture
def engine(engines: Mapping[str, sa.Engine]) -> sa.Engine:
    return engines["lyric"]


def test_submitted_work_waits_without_a_worker_and_its_polls_go_on_with_the_same_attempt(engine):
    api = Provider(remote.Pending("PENDING"), remote.Pending("TEXT_SUCCESS"))
    stage = remote_runner(engine, api)
    pipeline_id = add_job(stage)

    turn(stage)  # the submit
    row = job_row(engine, pipeline_id)
    assert (row.status, row.handle, row.polls, row.attempts) == (Status.AWAITING, "task-1", 0, 1)
    assert row.lease_owner is None and stage.active_jobs() == []  # no worker holds it
    assert api.submitted == [("task-1", f"http://gateway.invalid/cb/{pipeline_id}")]

    turn_when_due(stage)
    turn_when_due(stage)
    assert job_row(engine, pipeline_id).polls == 2
    turn_when_due(stage)  # the provider is done

    row = job_row(engine, pipeline_id)
    assert (row.status, row.handle, row.attempts, row.counted_attempts) == (Status.SUCCEEDED, None, 1, 1)
    assert api.polled == ["task-1"] * 3
    assert [a.outcome for a in attempt_rows(engine, pipeline_id)] == ["succeeded"]
    assert [kind for kind, _ in emitted(engine, pipeline_id)] == ["lyric.started", "lyric.completed"]


def test_the_providers_warnings_on_a_submission_stay_on_its_attempt_through_its_polls(engine):
    api = Provider(remote.Pending("rendering"))
    api.notes = ("Element 'Caption-11' was not found", "Element 'Caption-12' was not found")
    stage = remote_runner(engine, api)
    pipeline_id = add_job(stage)

    turn(stage)  # the submit
    turn_when_due(stage)  # a poll: still at work
    turn_when_due(stage)  # done

    (attempt,) = attempt_rows(engine, pipeline_id)
    assert attempt.outcome == "succeeded"
    assert attempt.notes == "Element 'Caption-11' was not found\nElement 'Caption-12' was not found"


def test_a_callback_brings_the_poll_forward(engine):
    api = Provider()
    stage = remote_runner(engine, api, remote.PollSchedule(first_s=3600.0, max_s=3600.0))
    pipeline_id = add_job(stage)
    turn(stage)
    assert stage.claim_next() is None  # the first poll is an hour away

    with db.transaction(engine) as conn:
        assert polls.poll_now(conn, pipeline_id)
    turn(stage)

    assert status_of(engine, pipeline_id) is Status.SUCCEEDED
    with db.transaction(engine) as conn:
        assert not polls.poll_now(conn, pipeline_id)  # a late callback changes nothing


def call_back(engine: sa.Engine, pipeline_id: str) -> Callable[[], bool]:
    """The provider's callback for the pipeline, as the stage's handler applies it (its own transaction)."""

    def callback() -> bool:
        with db.transaction(engine) as conn:
            return polls.poll_now(conn, pipeline_id)

    return callback


def test_a_callback_that_comes_before_the_submit_is_answered_makes_the_first_poll_due_at_once(engine):
    api = Provider()
    stage = remote_runner(engine, api, remote.PollSchedule(first_s=3600.0, max_s=3600.0))
    pipeline_id = add_job(stage)
    api.meanwhile = call_back(engine, pipeline_id)  # a fast provider: done before its answer to the submit left

    turn(stage)  # the submit
    row = job_row(engine, pipeline_id)
    assert (row.status, row.called_back_at) == (Status.AWAITING, None)
    api.meanwhile = None
    assert turn(stage) is not None  # not an hour later

    assert status_of(engine, pipeline_id) is Status.SUCCEEDED
    assert api.polled == ["task-1"]


def test_a_callback_during_a_poll_that_found_the_work_unfinished_makes_the_next_poll_due_at_once(engine):
    api = Provider(remote.Pending("rendering"))
    stage = remote_runner(engine, api, remote.PollSchedule(first_s=3600.0, max_s=3600.0))
    pipeline_id = add_job(stage)
    turn(stage)  # the submit
    assert call_back(engine, pipeline_id)()  # a first callback: the provider's work moved on
    api.meanwhile = call_back(engine, pipeline_id)  # and finished while the poll it caused was out

    turn(stage)  # the poll: still rendering, by the provider's answer
    assert job_row(engine, pipeline_id).status == Status.AWAITING
    api.meanwhile = None
    assert turn(stage) is not None

    assert status_of(engine, pipeline_id) is Status.SUCCEEDED
    assert api.polled == ["task-1", "task-1"]


def test_a_callback_to_a_held_job_is_forgotten_when_its_attempt_ends(engine):
    def unavailable() -> None:
        raise errors.ProviderError("provider_unavailable", "503 on submit")

    api = Provider()
    api.meanwhile = unavailable
    stage = remote_runner(engine, api)
    pipeline_id = add_job(stage)
    claim = stage.claim_next()
    assert claim is not None
    assert not call_back(engine, pipeline_id)()  # held: kept for the poll its worker would schedule
    assert job_row(engine, pipeline_id).called_back_at is not None

    stage.execute(claim)  # the submit fails: the attempt ends, a retry will submit anew

    row = job_row(engine, pipeline_id)
    assert (row.status, row.called_back_at) == (Status.RETRY_WAIT, None)


def test_of_callback_and_poll_racing_only_one_claim_completes_the_job(engine):
    api = Provider()
    stages = [remote_runner(engine, api, worker=f"worker-{i}") for i in range(4)]
    pipeline_id = add_job(stages[0])
    turn(stages[0])
    with db.transaction(engine) as conn:
        polls.poll_now(conn, pipeline_id)

    claims = race(4, lambda i: stages[i].claim_next())
    won = [claim for claim in claims if claim is not None]
    assert len(won) == 1
    stages[0].execute(won[0])
    end_spans(claims)

    assert status_of(engine, pipeline_id) is Status.SUCCEEDED
    assert [kind for kind, _ in emitted(engine, pipeline_id)].count("lyric.completed") == 1


def test_a_failed_poll_request_keeps_waiting_on_the_same_work_and_costs_nothing(engine):
    api = Provider(
        errors.ProviderError("provider_unavailable", "503"),
        errors.ProviderError(codes.ErrorCode.PROVIDER_RATE_LIMITED, "429", retry_after_s=0.2),
    )
    stage = remote_runner(engine, api)
    pipeline_id = add_job(stage)
    turn(stage)

    turn_when_due(stage)
    row = job_row(engine, pipeline_id)
    assert (row.status, row.handle, row.counted_attempts) == (Status.AWAITING, "task-1", 0)
    turn_when_due(stage)
    row = job_row(engine, pipeline_id)
    assert row.status == Status.AWAITING and row.due_at >= row.updated_at + dt.timedelta(seconds=0.19)
    turn_when_due(stage)

    assert status_of(engine, pipeline_id) is Status.SUCCEEDED
    assert len(api.submitted) == 1


def test_failed_work_at_the_provider_fails_the_attempt_and_the_next_one_submits_anew(engine):
    api = Provider(errors.ProviderError("provider_job_failed", "GENERATE_AUDIO_FAILED"))
    stage = remote_runner(engine, api)
    pipeline_id = add_job(stage)
    turn(stage)
    turn_when_due(stage)

    row = job_row(engine, pipeline_id)
    assert (row.status, row.handle, row.counted_attempts) == (Status.RETRY_WAIT, None, 1)
    turn_when_due(stage, "the second attempt")
    turn_when_due(stage)

    assert [handle for handle, _ in api.submitted] == ["task-1", "task-2"]
    assert api.polled[:2] == ["task-1", "task-1"]  # the second attempt looked the failed work up first
    assert [a.outcome for a in attempt_rows(engine, pipeline_id)] == ["failed_retryable", "succeeded"]


def test_work_that_never_finishes_fails_its_attempt_after_the_give_up_time(engine):
    api = Provider(*[remote.Pending("PENDING")] * 100)
    stage = remote_runner(engine, api, remote.PollSchedule(first_s=0.05, max_s=0.05, give_up_s=0.3), max_attempts=1)
    pipeline_id = add_job(stage)
    turn(stage)

    waits.until(lambda: turn(stage) and status_of(engine, pipeline_id) is Status.FAILED, timeout_s=5.0)
    assert job_row(engine, pipeline_id).last_error_code == "provider_job_timeout"


def test_a_poll_whose_worker_died_is_due_again_with_its_handle_not_submitted_again(engine):
    api = Provider()
    stage = remote_runner(engine, api)
    pipeline_id = add_job(stage)
    turn(stage)
    dead = waits.until(stage.claim_next, timeout_s=5.0, what="the poll")  # its worker dies holding it
    end_spans([dead])
    with db.transaction(engine) as conn:
        conn.execute(
            tables.jobs.update()
            .where(tables.jobs.c.pipeline_id == pipeline_id)
            .values(lease_expires_at=sa.func.now() - sa.text("interval '1 second'"))
        )

    other = remote_runner(engine, api, worker="worker-b")
    assert other.recover_expired_leases() == 1
    row = job_row(engine, pipeline_id)
    assert (row.status, row.handle, row.counted_attempts) == (Status.AWAITING, "task-1", 0)
    assert "lyric.retrying" not in [kind for kind, _ in emitted(engine, pipeline_id)]

    turn_when_due(other)
    assert status_of(engine, pipeline_id) is Status.SUCCEEDED and len(api.submitted) == 1


def test_a_cancel_while_the_work_waits_at_the_provider_ends_the_job_and_its_attempt(engine):
    api = Provider()
    stage = remote_runner(engine, api, remote.PollSchedule(first_s=3600.0, max_s=3600.0))
    pipeline_id = add_job(stage)
    turn(stage)

    request = events.PipelineCancelRequested(pipeline_id=pipeline_id, operation=1, reason="not needed")
    with db.transaction(engine) as conn:
        assert stage.apply_cancel(conn, request) is None  # no worker to stop

    row = job_row(engine, pipeline_id)
    assert (row.status, row.handle) == (Status.CANCELED, None)
    assert [a.outcome for a in attempt_rows(engine, pipeline_id)] == ["canceled"]


def test_a_quota_lets_only_its_burst_through_then_its_rate(engine):
    name = fresh_provider(engine, max_rate_per_s=2.0, min_rate_per_s=1.0, burst=2.0)
    stage = remote_runner(engine, Provider(), remote.PollSchedule(first_s=3600.0, max_s=3600.0))
    stage.provider = name
    for _ in range(4):
        add_job(stage)

    assert turn(stage) is not None and turn(stage) is not None
    assert stage.claim_next() is None  # the burst is spent: the job stays due, no attempt begun
    waits.until(lambda: turn(stage), timeout_s=2.0, what="a token after half a second")
    assert quota_row(engine, name)["tokens"] < 1


def test_a_rate_limit_halves_the_rate_waits_its_retry_after_and_costs_no_attempt(engine):
    name = fresh_provider(engine, max_rate_per_s=40.0, min_rate_per_s=1.0, burst=5.0)
    calls = itertools.count()

    def submit_limited_once(job, callback_url, cancel):
        if next(calls) == 0:
            raise errors.ProviderError(codes.ErrorCode.PROVIDER_RATE_LIMITED, "429", retry_after_s=1.0)
        return remote.Submitted("task-1")

    api = Provider()
    api.submit = submit_limited_once  # type: ignore[method-assign]
    stage = remote_runner(engine, api)
    stage.provider = name
    pipeline_id = add_job(stage)

    before = dt.datetime.now(dt.UTC)
    turn(stage)
    after = dt.datetime.now(dt.UTC)
    row, limits = job_row(engine, pipeline_id), quota_row(engine, name)
    assert (row.status, row.counted_attempts, row.last_error_code) == (
        Status.RETRY_WAIT,
        0,
        codes.ErrorCode.PROVIDER_RATE_LIMITED,
    )
    assert (limits["rate_per_s"], limits["throttled"]) == (20.0, 1)
    assert [a.outcome for a in attempt_rows(engine, pipeline_id)] == ["interrupted"]
    # Blocked for the Retry-After from the refusal (within the turn), whatever a busy host made of the time since.
    retry_after = dt.timedelta(seconds=1.0)
    assert before + retry_after <= limits["blocked_until"] <= after + retry_after
    if limits["blocked_until"] > dt.datetime.now(dt.UTC):
        assert stage.claim_next() is None  # nothing goes to the provider before its Retry-After

    waits.until(lambda: turn(stage), timeout_s=3.0, what="the submit after the Retry-After")
    waits.until(lambda: turn(stage), timeout_s=3.0, what="the poll")
    assert status_of(engine, pipeline_id) is Status.SUCCEEDED
    assert quota_row(engine, name)["rate_per_s"] == pytest.approx(20.0 + 2 * (40.0 - 1.0) / quota.INCREASE_STEPS)


def test_at_most_max_in_flight_jobs_are_at_the_provider_and_their_polls_still_go(engine):
    with engine.connect() as conn:
        busy = conn.execute(
            sa.select(sa.func.count()).where(tables.jobs.c.status.in_(["RUNNING", "AWAITING"]))
        ).scalar_one()
    name = fresh_provider(engine, max_in_flight=busy + 1)
    api = Provider(remote.Pending("PENDING"))
    stage = remote_runner(engine, api)
    stage.provider = name
    first = add_job(stage)
    turn(stage)
    second = add_job(stage)

    assert turn_when_due(stage).pipeline_id == first  # a poll, while the new job waits for room
    assert status_of(engine, second) is Status.PENDING
    turn_when_due(stage)  # the first is done: room for the second
    assert status_of(engine, first) is Status.SUCCEEDED
    assert turn_when_due(stage).pipeline_id == second


def status_of(engine: sa.Engine, pipeline_id: str) -> Status:
    return Status(job_row(engine, pipeline_id).status)


def test_finished_work_is_fetched_even_when_it_is_had_after_the_give_up_time(engine):
    api = Provider()
    stage = remote_runner(engine, api, remote.PollSchedule(first_s=0.05, max_s=0.05, give_up_s=60.0))
    pipeline_id = add_job(stage)
    turn(stage)
    with db.transaction(engine) as conn:  # the service was down for an hour meanwhile
        conn.execute(
            tables.jobs.update()
            .where(tables.jobs.c.pipeline_id == pipeline_id)
            .values(submitted_at=sa.func.now() - sa.text("interval '1 hour'"))
        )

    turn_when_due(stage)

    assert status_of(engine, pipeline_id) is Status.SUCCEEDED and len(api.submitted) == 1


def test_a_key_refused_while_work_waits_at_the_provider_does_not_lose_the_work(engine):
    api = Provider(errors.ProviderError("provider_auth", "401: the key is being rotated", retryable=False))
    stage = remote_runner(engine, api)
    pipeline_id = add_job(stage)
    turn(stage)

    turn_when_due(stage)
    row = job_row(engine, pipeline_id)
    assert (row.status, row.handle, row.counted_attempts) == (Status.AWAITING, "task-1", 0)
    turn_when_due(stage)
    assert status_of(engine, pipeline_id) is Status.SUCCEEDED and len(api.submitted) == 1


def test_a_provider_that_never_stops_saying_too_many_is_charged_after_its_free_attempts(engine):
    def always_limited(job, callback_url, cancel):
        raise errors.ProviderError(codes.ErrorCode.PROVIDER_RATE_LIMITED, "429")

    api = Provider()
    api.submit = always_limited  # type: ignore[method-assign]
    stage = remote_runner(engine, api)
    pipeline_id = add_job(stage)
    with db.transaction(engine) as conn:  # as if FREE_RATE_LIMITS attempts had been turned away already
        conn.execute(
            tables.jobs.update()
            .where(tables.jobs.c.pipeline_id == pipeline_id)
            .values(attempts=outcomes.FREE_RATE_LIMITS)
        )

    turn(stage)

    row = job_row(engine, pipeline_id)
    assert (row.status, row.counted_attempts, row.last_error_code) == (
        Status.RETRY_WAIT,
        1,
        codes.ErrorCode.PROVIDER_RATE_LIMITED,
    )


def test_calls_already_on_their_way_when_the_provider_says_too_many_halve_the_rate_once(engine):
    name = fresh_provider(engine, max_rate_per_s=40.0, min_rate_per_s=1.0, burst=5.0)
    with db.transaction(engine) as conn:
        quota.throttled(conn, name, 2.0)
    with db.transaction(engine) as conn:
        quota.throttled(conn, name, 2.0)
        quota.throttled(conn, name, 10**9)  # an absurd Retry-After blocks for an hour at most

    limits = quota_row(engine, name)
    assert (limits["rate_per_s"], limits["throttled"]) == (20.0, 3)
    assert (limits["blocked_until"] - dt.datetime.now(dt.UTC)).total_seconds() <= quota.MAX_BLOCK_S


def test_too_many_without_a_retry_after_spends_every_shards_tokens(engine):
    name = fresh_provider(engine, max_rate_per_s=40.0, min_rate_per_s=1.0, burst=20.0)
    assert quota.Limits(name, 40.0, 1.0, 20.0).shards == 4  # 5 tokens each, refilled at a quarter of the rate
    assert quota_row(engine, name)["tokens"] == pytest.approx(20.0)
    said = time.monotonic()
    with db.transaction(engine) as conn:
        quota.throttled(conn, name, 0.0)  # nothing blocks: only the tokens spent hold the calls back
    with db.transaction(engine) as conn:
        next_call = quota.gate(conn, name)
    after = quota_row(engine, name)
    elapsed_s = time.monotonic() - said

    assert after["rate_per_s"] == 20.0
    assert after["tokens"] <= 20.0 * elapsed_s + 1e-6  # what the halved rate refilled since, no more
    if elapsed_s < 0.2:  # a shard refills a whole token in 0.2 s at 5/s
        assert (next_call.open, next_call.closed_by) == (False, quota.NO_TOKEN)


def test_a_provider_down_for_maintenance_costs_no_attempt_however_often_it_says_so(engine):
    def in_maintenance(job, callback_url, cancel):
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_MAINTENANCE, "the music API answered code 455", retry_after_s=0.1
        )

    api = Provider()
    api.submit = in_maintenance  # type: ignore[method-assign]
    stage = remote_runner(engine, api, max_attempts=1)
    pipeline_id = add_job(stage)
    with db.transaction(engine) as conn:  # turned away many times already: still not charged (unlike "too many")
        conn.execute(
            tables.jobs.update()
            .where(tables.jobs.c.pipeline_id == pipeline_id)
            .values(attempts=outcomes.FREE_RATE_LIMITS + 5)
        )

    turn(stage)

    row = job_row(engine, pipeline_id)
    assert (row.status, row.counted_attempts, row.last_error_code) == (
        Status.RETRY_WAIT,
        0,
        codes.ErrorCode.PROVIDER_MAINTENANCE,
    )
    assert row.due_at >= row.updated_at + dt.timedelta(seconds=0.09)
    assert [a.outcome for a in attempt_rows(engine, pipeline_id)] == ["interrupted"]


def test_work_given_up_on_but_finished_since_is_taken_by_the_next_attempt_and_not_paid_for_again(engine):
    api = Provider(*[remote.Pending("PENDING")] * 100)
    stage = remote_runner(engine, api, remote.PollSchedule(first_s=0.05, max_s=0.05, give_up_s=0.12))
    pipeline_id = add_job(stage)
    turn(stage)
    waits.until(lambda: turn(stage) and status_of(engine, pipeline_id) is Status.RETRY_WAIT, timeout_s=5.0)
    assert (job_row(engine, pipeline_id).last_error_code, job_row(engine, pipeline_id).handle) == (
        "provider_job_timeout",
        None,
    )

    api.polls.clear()  # the provider finishes the work after all

    turn_when_due(stage, "the second attempt")

    row = job_row(engine, pipeline_id)
    assert (row.status, row.previous_handle) == (Status.SUCCEEDED, "task-1")
    assert [handle for handle, _ in api.submitted] == ["task-1"]  # looked up, not submitted again
    assert [a.outcome for a in attempt_rows(engine, pipeline_id)] == ["failed_retryable", "succeeded"]
    assert [a.submitted_at is not None for a in attempt_rows(engine, pipeline_id)] == [True, False]


def test_work_an_earlier_attempt_left_still_at_work_is_waited_on_and_not_paid_for_again(engine):
    """A cancel, then an operator's retry, while the provider still makes the song: the retry waits on that work."""
    api = Provider(*[remote.Pending("PENDING")] * 3)
    stage = remote_runner(engine, api, remote.PollSchedule(first_s=0.05, max_s=0.05, give_up_s=60.0))
    pipeline_id = add_job(stage)
    turn(stage)
    with db.transaction(engine) as conn:
        stage.apply_cancel(conn, events.PipelineCancelRequested(pipeline_id=pipeline_id, operation=1, reason="oops"))
    retry = events.PipelineRetryRequested(pipeline_id=pipeline_id, operation=2, stage=events.Stage.LYRIC)
    with db.transaction(engine) as conn:
        assert stage.apply_retry(conn, retry)

    turn_when_due(stage, "the retry's attempt")  # looks task-1 up: still at work
    row = job_row(engine, pipeline_id)
    assert (row.status, row.handle) == (Status.AWAITING, "task-1")
    assert row.submitted_at == row.previous_submitted_at  # its give-up time counts from task-1's submit
    waits.until(lambda: turn(stage) and status_of(engine, pipeline_id) is Status.SUCCEEDED, timeout_s=5.0)

    assert [handle for handle, _ in api.submitted] == ["task-1"]  # paid once
    assert [a.submitted_at is not None for a in attempt_rows(engine, pipeline_id)] == [True, False]
    assert [a.outcome for a in attempt_rows(engine, pipeline_id)] == ["canceled", "succeeded"]


def test_work_an_earlier_attempt_left_unfinished_past_its_give_up_time_is_submitted_anew(engine):
    api = Provider(*[remote.Pending("PENDING")] * 100)
    stage = remote_runner(engine, api, remote.PollSchedule(first_s=0.05, max_s=0.05, give_up_s=0.3))
    pipeline_id = add_job(stage)
    turn(stage)
    waits.until(lambda: turn(stage) and status_of(engine, pipeline_id) is Status.RETRY_WAIT, timeout_s=5.0)
    api.polls[:] = [remote.Pending("PENDING")]  # the look-up finds task-1 still unfinished, past its give-up time

    turn_when_due(stage, "the second attempt")

    assert [handle for handle, _ in api.submitted] == ["task-1", "task-2"]
    assert job_row(engine, pipeline_id).handle == "task-2"


@pytest.mark.parametrize("then", ["found", "still not found"])
def test_not_found_just_after_the_submit_is_asked_again_and_only_later_is_lost(engine, monkeypatch, then):
    """Suno's users report "not found" for a task polled right after its submit: it is not listed yet."""
    lost = errors.ProviderError(codes.ErrorCode.PROVIDER_JOB_LOST, "no such task")
    api = Provider(lost)  # and it says so again for as long as it is told to (`failed`)
    stage = remote_runner(engine, api, max_attempts=1)
    pipeline_id = add_job(stage)
    turn(stage)

    turn_when_due(stage)  # not found, 0.05 s after the submit
    row = job_row(engine, pipeline_id)
    assert (row.status, row.handle, row.counted_attempts) == (Status.AWAITING, "task-1", 0)
    if then == "found":
        api.failed.clear()  # the provider lists the task now
    else:
        monkeypatch.setattr(remote, "NOT_FOUND_GRACE_S", 0.0)  # the window has passed
    waits.until(lambda: turn(stage) and status_of(engine, pipeline_id).terminal, timeout_s=5.0)

    row = job_row(engine, pipeline_id)
    if then == "found":
        assert (row.status, len(api.submitted)) == (Status.SUCCEEDED, 1)
    else:
        assert (row.status, row.last_error_code) == (Status.FAILED, codes.ErrorCode.PROVIDER_JOB_LOST)
