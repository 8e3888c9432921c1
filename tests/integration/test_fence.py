"""What leaves for a provider, on a real PostgreSQL.

Work goes only under a lease its worker knows it holds and the database agrees it holds, and each submission is
recorded on its attempt with its key, so that a worker frozen past its lease sends nothing and a checker can count
what each job sent.

The provider is the scripted RemoteApi of test_remote_jobs, which submits past the attempt's fence as every
adapter does (HttpProvider.submit); the adapters and their fakes have their own tests in tests/providers. A
frozen worker is played by a clock the test moves on at once, as the process finds it on waking: its
heartbeat stood still with it, so nothing renewed the lease meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from castad_contracts import codes, events
from castad_faults import outage
from castad_runtime import db, tables
from castad_runtime.stage import cancellation, errors, leases, machine, remote, repository
from castad_runtime.stage.repository import attempts

from tests.integration.test_remote_jobs import Provider, remote_runner, turn, turn_when_due
from tests.integration.test_stage_runner import add_job, attempt_rows, job_row, status_of
from tests.support import waits

pytestmark = pytest.mark.integration

Status = machine.Status
LEASE_S = 30.0  # the heartbeat's first renewal is 10 s away: none happens during a test


class Clock:
    """The leases' clock of one worker; `freeze(s)`: the worker stood still for `s` seconds, just now."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return leases.clock() + self.offset

    def freeze(self, seconds: float) -> None:
        self.offset += seconds


class StandsStill:
    """A provider whose first submit stands still (`arrived`) until the test lets it go on (`wake`).

    It stands `before` the submit leaves (frozen at its fence) or `after` the provider took it (its answer lost).
    """

    def __init__(self, provider: Provider, where: str, clock: Clock | None = None, frozen_s: float = 0.0) -> None:
        self.provider = provider
        self.where = where
        self.clock = clock
        self.frozen_s = frozen_s
        self.arrived = threading.Event()
        self._wake = threading.Event()

    def submit(
        self, job: repository.Job, callback_url: str | None, cancel: cancellation.Cancellation
    ) -> remote.Submitted:
        if self.arrived.is_set():  # only the first submit stands still
            return self.provider.submit(job, callback_url, cancel)
        submitted = self.provider.submit(job, callback_url, cancel) if self.where == "after" else None
        self.arrived.set()
        assert self._wake.wait(20), "the test never woke the worker"
        if self.clock is not None:
            self.clock.freeze(self.frozen_s)
        return submitted or self.provider.submit(job, callback_url, cancel)

    def poll(self, handle: str, cancel: cancellation.Cancellation) -> remote.Pending | remote.Finished:
        return self.provider.poll(handle, cancel)

    def wake(self) -> None:
        self._wake.set()


def expire_lease(engine: sa.Engine, pipeline_id: str) -> None:
    """The job's lease ran out in the database (its worker stopped renewing it)."""
    with db.transaction(engine) as conn:
        conn.execute(
            tables.jobs.update()
            .where(tables.jobs.c.pipeline_id == pipeline_id)
            .values(lease_expires_at=sa.func.now() - sa.text("interval '1 second'"))
        )


def submissions(engine: sa.Engine, pipeline_id: str) -> attempts.Submissions | None:
    with engine.connect() as conn:
        return attempts.submissions(conn, [pipeline_id]).get(pipeline_id)


def sample(stage: Any, outcome: str) -> float:
    labels = {"stage": "lyric", "provider": "none", "outcome": outcome}
    return stage.metrics.registry.get_sample_value("castad_provider_submissions_total", labels) or 0.0


def started(stage: Any) -> tuple[Any, threading.Thread]:
    """A claim of the due job, run on a thread of its own (a worker), and that thread."""
    claim = stage.claim_next()
    assert claim is not None
    worker = threading.Thread(target=stage.execute, args=(claim,))
    worker.start()
    return claim, worker


@pytest.fixture
def engine(engines: Mapping[str, sa.Engine]) -> sa.Engine:
    return engines["lyric"]


def test_a_submission_is_recorded_on_its_attempt_with_its_key_and_polls_record_none(engine):
    api = Provider()
    stage = remote_runner(engine, api, lease_s=LEASE_S)
    pipeline_id = add_job(stage)

    job = turn(stage)
    assert job is not None
    turn_when_due(stage)  # the poll: done

    assert status_of(engine, pipeline_id) is Status.SUCCEEDED
    [attempt] = attempt_rows(engine, pipeline_id)
    assert attempt.submitted_at is not None and attempt.submitted_at >= attempt.started_at
    assert attempt.submission_key == job.submission_key == f"castad-{pipeline_id}-0-1"
    assert submissions(engine, pipeline_id) == attempts.Submissions(sent=1, keys=1)
    assert (sample(stage, "sent"), sample(stage, "fenced")) == (1, 0)


def test_a_worker_frozen_past_its_lease_sends_nothing_and_the_attempt_claimed_again_sends_under_its_key(engine):
    clock = Clock()
    api = Provider()
    frozen = StandsStill(api, "before", clock, frozen_s=2 * LEASE_S)
    frozen.wake()  # it stands still only on its clock: it finds its lease gone at once
    stage = remote_runner(engine, frozen, lease_s=LEASE_S, clock=clock)
    pipeline_id = add_job(stage)

    lost = turn(stage)

    assert api.submitted == []
    row = job_row(engine, pipeline_id)
    assert (row.status, row.counted_attempts, row.last_error_code) == (Status.RETRY_WAIT, 0, codes.ErrorCode.LEASE_LOST)
    [attempt] = attempt_rows(engine, pipeline_id)
    assert (attempt.outcome, attempt.error_code, attempt.submitted_at) == (
        "interrupted",
        codes.ErrorCode.LEASE_LOST,
        None,
    )
    assert (sample(stage, "sent"), sample(stage, "fenced")) == (0, 1)

    again = turn(stage)  # due at once, not counted; the clock no longer jumps

    assert again is not None and lost is not None
    assert again.attempts == 2 and again.submission_key == lost.submission_key
    assert [handle for handle, _ in api.submitted] == ["task-1"]
    assert [(a.number, a.submission_key) for a in attempt_rows(engine, pipeline_id)] == [
        (1, None),
        (2, lost.submission_key),
    ]
    assert submissions(engine, pipeline_id) == attempts.Submissions(sent=1, keys=1)


def test_a_worker_waking_after_another_took_its_attempt_over_sends_nothing_and_records_nothing(engine):
    clock = Clock()
    api = Provider()
    frozen = StandsStill(api, "before", clock, frozen_s=2 * LEASE_S)
    a = remote_runner(engine, frozen, worker="worker-a", lease_s=LEASE_S, clock=clock)
    b = remote_runner(engine, api, worker="worker-b", lease_s=LEASE_S)
    pipeline_id = add_job(a)
    claim, worker_a = started(a)
    assert frozen.arrived.wait(10)  # worker A stands still just before its submit

    expire_lease(engine, pipeline_id)
    assert b.recover_expired_leases() == 1
    taken = turn(b)
    assert taken is not None and taken.submission_key == claim.job.submission_key
    frozen.wake()
    worker_a.join(10)

    assert not worker_a.is_alive()
    assert [handle for handle, _ in api.submitted] == ["task-1"]  # worker B's alone
    rows = attempt_rows(engine, pipeline_id)
    assert [(a.worker, a.outcome, a.error_code, a.submission_key) for a in rows] == [
        ("worker-a", "interrupted", "lease_expired", None),
        ("worker-b", "running", None, taken.submission_key),  # its work awaits its poll
    ]
    row = job_row(engine, pipeline_id)
    assert (row.status, row.handle, row.version) == (Status.AWAITING, "task-1", taken.version)  # A wrote nothing


def test_work_of_a_job_canceled_by_another_replica_does_not_leave_though_its_worker_knows_of_no_cancel(engine):
    api = Provider()
    held = StandsStill(api, "before")  # not frozen: by its own clock its lease holds
    stage = remote_runner(engine, held, worker="worker-a", lease_s=LEASE_S)
    other = remote_runner(engine, Provider(), worker="worker-b", lease_s=LEASE_S)
    pipeline_id = add_job(stage)
    _, worker = started(stage)
    assert held.arrived.wait(10)

    request = events.PipelineCancelRequested(pipeline_id=pipeline_id, operation=1, reason="not needed")
    with db.transaction(engine) as conn:
        other.apply_cancel(conn, request)  # handled by the other replica: this worker is not told
    held.wake()
    worker.join(10)

    assert not worker.is_alive()
    assert api.submitted == []
    assert status_of(engine, pipeline_id) is Status.CANCELED
    [attempt] = attempt_rows(engine, pipeline_id)
    assert (attempt.outcome, attempt.submitted_at) == ("canceled", None)


def test_a_cancel_committing_while_the_fence_records_stops_the_work_from_leaving(engine):
    """A cancel committing while the fence records the submission leaves nothing to send.

    The cancel of another replica holds its locks (not yet committed) when the worker's fence records the
    submission: the fence waits for it and, once it committed, finds the claim gone; nothing leaves.
    """
    api = Provider()
    held = StandsStill(api, "before")
    stage = remote_runner(engine, held, worker="worker-a", lease_s=LEASE_S)
    other = remote_runner(engine, Provider(), worker="worker-b", lease_s=LEASE_S)
    pipeline_id = add_job(stage)
    _, worker = started(stage)
    assert held.arrived.wait(10)

    request = events.PipelineCancelRequested(pipeline_id=pipeline_id, operation=1, reason="not needed")
    with db.transaction(engine) as conn:
        other.apply_cancel(conn, request)
        held.wake()  # the worker's fence now waits on the job row this transaction holds
        waits.until(lambda: waiting_on_a_lock(engine), what="the fence waiting for the cancel to commit")
    worker.join(10)

    assert not worker.is_alive()
    assert api.submitted == []
    [attempt] = attempt_rows(engine, pipeline_id)
    assert (attempt.outcome, attempt.submitted_at) == ("canceled", None)


def waiting_on_a_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        return bool(conn.execute(sa.text(query)).scalar_one())


def test_a_submit_whose_answer_was_lost_goes_again_under_the_same_key_and_both_are_counted(engine):
    """The limit no fence closes.

    Worker A's submit was taken by the provider, and A stood still before it recorded the handle. B sends the
    attempt again, under the same key: one job at a provider that takes keys, two at one that does not (each of
    Castad's three: docs/providers.md). The stage's database counts both, so a fault run can say how often that
    happened.
    """
    api = Provider()
    frozen = StandsStill(api, "after")
    a = remote_runner(engine, frozen, worker="worker-a", lease_s=LEASE_S)
    b = remote_runner(engine, api, worker="worker-b", lease_s=LEASE_S)
    pipeline_id = add_job(a)
    claim, worker_a = started(a)
    assert frozen.arrived.wait(10)

    expire_lease(engine, pipeline_id)
    assert b.recover_expired_leases() == 1
    taken = turn(b)
    frozen.wake()  # A's answer arrives late: its claim is gone, it records nothing
    worker_a.join(10)

    assert taken is not None and taken.submission_key == claim.job.submission_key
    assert [handle for handle, _ in api.submitted] == ["task-1", "task-2"]
    assert submissions(engine, pipeline_id) == attempts.Submissions(sent=2, keys=1)
    assert job_row(engine, pipeline_id).handle == "task-2"


def test_the_submission_key_is_new_after_a_counted_failure_and_for_an_operators_retry(engine):
    failed = errors.ProviderError("provider_job_failed", "GENERATE_AUDIO_FAILED")
    api = Provider(failed, failed)
    stage = remote_runner(engine, api, lease_s=LEASE_S, max_attempts=2)
    pipeline_id = add_job(stage)
    for _ in range(4):  # two attempts: each submits, and its poll finds the work failed
        turn_when_due(stage)
    assert status_of(engine, pipeline_id) is Status.FAILED

    retry = events.PipelineRetryRequested(pipeline_id=pipeline_id, operation=1, stage=events.Stage.LYRIC)
    with db.transaction(engine) as conn:
        assert stage.apply_retry(conn, retry)
    turn_when_due(stage)

    keys = [a.submission_key for a in attempt_rows(engine, pipeline_id)]
    assert keys == [f"castad-{pipeline_id}-0-1", f"castad-{pipeline_id}-0-2", f"castad-{pipeline_id}-1-1"]
    assert submissions(engine, pipeline_id) == attempts.Submissions(sent=3, keys=3)


def test_a_database_out_at_the_fence_hands_the_attempt_back_uncounted_and_nothing_leaves(engine, installation):
    url = installation.database_urls["lyric"]
    api = Provider()
    original = api.submit
    blocked: list[bool] = []

    def submit_into_an_outage(job: repository.Job, callback_url: str | None, cancel: Any) -> str:
        if not blocked:
            blocked.append(True)
            outage.block(url)
            threading.Timer(1.0, outage.unblock, [url]).start()
        return original(job, callback_url, cancel)

    api.submit = submit_into_an_outage  # type: ignore[method-assign]
    stage = remote_runner(engine, api, lease_s=LEASE_S, max_attempts=1)
    pipeline_id = add_job(stage)

    turn(stage)  # its outcome is recorded once the database is back

    assert api.submitted == []
    [attempt] = attempt_rows(engine, pipeline_id)
    assert (attempt.outcome, attempt.error_code, attempt.submitted_at) == ("interrupted", codes.ErrorCode.OUTAGE, None)
    assert job_row(engine, pipeline_id).counted_attempts == 0
    waits.until(lambda: turn(stage), timeout_s=10.0, what="the attempt after the outage's backoff")
    assert [handle for handle, _ in api.submitted] == ["task-1"]
