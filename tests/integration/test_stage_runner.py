"""The stage machine on a real PostgreSQL: claims, attempts, retries, leases and timeouts.

A StageRunner of the lyric stage runs a scripted provider (`work`) against the lyric
database of the installation, as castad_runtime.stage.service wires it; several runners
with different worker ids play several workers or processes.
"""

from __future__ import annotations

import datetime as dt
import errno
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from castad_contracts import brief, envelope, events
from castad_faults import outage
from castad_runtime import db, outages, tables
from castad_runtime.stage import cancellation, errors, handlers, machine, outcomes, repository, runner, scheduler
from castad_runtime.stage.repository import claiming
from castad_testkit import briefs

from tests.integration.helpers import output, pipeline_requested, stage_runner, succeed
from tests.support import waits

pytestmark = pytest.mark.integration

Status = machine.Status


class Script:
    """A provider that raises or returns, call by call, as told; then always returns."""

    def __init__(self, *steps: Exception | None) -> None:
        self.steps = list(steps)
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        with self._lock:
            self.calls += 1
            step = self.steps.pop(0) if self.steps else None
        if step is not None:
            raise step
        return output()


def add_job(stage: runner.StageRunner, **trigger: Any) -> str:
    """A pipeline.requested accepted by the stage: one PENDING job, due now."""
    request = pipeline_requested(**trigger)
    with db.transaction(stage.engine) as conn:
        assert stage.accept(conn, request)
    return request.pipeline_id


def job_row(engine: sa.Engine, pipeline_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.select(tables.jobs).where(tables.jobs.c.pipeline_id == pipeline_id)).one()


def attempt_rows(engine: sa.Engine, pipeline_id: str) -> list[Any]:
    a, j = tables.attempts, tables.jobs
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(a).join(j, j.c.id == a.c.job_id).where(j.c.pipeline_id == pipeline_id).order_by(a.c.number)
            )
        )


def emitted(engine: sa.Engine, pipeline_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(event type, payload) of every outbox row of the pipeline, in the order written."""
    o = tables.outbox
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(o.c.routing_key, o.c.envelope).where(o.c.pipeline_id == pipeline_id).order_by(o.c.id)
        )
        return [(row.routing_key, row.envelope["data"]) for row in rows]


def facts(engine: sa.Engine, pipeline_id: str) -> list[tuple[str, int]]:
    return [(kind.split(".", 1)[1], data["attempt"]) for kind, data in emitted(engine, pipeline_id)]


def status_of(engine: sa.Engine, pipeline_id: str) -> Status:
    return Status(job_row(engine, pipeline_id).status)


def end_spans(claims: Iterable[runner.Claim | None]) -> None:
    for claim in claims:
        if claim is not None:
            claim.span.end()


@pytest.fixture
def engine(engines: Mapping[str, sa.Engine]) -> sa.Engine:
    return engines["lyric"]


@pytest.fixture
def run_scheduler() -> Iterator[Callable[..., scheduler.JobScheduler]]:
    """JobSchedulers (by default two slots, polling every 50 ms), stopped after the test."""
    started: list[scheduler.JobScheduler] = []

    def start(stage: runner.StageRunner, concurrency: int = 2, poll_s: float = 0.05) -> scheduler.JobScheduler:
        jobs = scheduler.JobScheduler(stage, concurrency=concurrency, poll_s=poll_s)
        jobs.start()
        started.append(jobs)
        return jobs

    yield start
    for jobs in started:
        jobs.stop()


def race(n: int, body: Callable[[int], Any]) -> list[Any]:
    """Run body(i) on n threads released at the same instant; their results in thread order."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    failures: list[BaseException] = []

    def target(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = body(i)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert not failures, failures
    return results


def test_of_runners_racing_for_one_due_job_exactly_one_claims_it(engine):
    """Eight workers claim at the same instant: one wins the compare-and-set, one attempt is opened."""
    runners = [stage_runner(engine, succeed, worker=f"worker-{i}") for i in range(8)]
    pipeline_id = add_job(runners[0])

    claims = race(len(runners), lambda i: runners[i].claim_next())
    end_spans(claims)

    winners = [i for i, claim in enumerate(claims) if claim is not None]
    assert len(winners) == 1
    job = job_row(engine, pipeline_id)
    assert (job.status, job.version, job.attempts, job.lease_owner) == ("RUNNING", 1, 1, f"worker-{winners[0]}")
    [attempt] = attempt_rows(engine, pipeline_id)
    assert (attempt.number, attempt.worker, attempt.outcome) == (1, f"worker-{winners[0]}", "running")
    assert facts(engine, pipeline_id) == [("started", 1)]


def test_racing_runners_claim_each_of_many_jobs_exactly_once(engine):
    """Eight workers claim until nothing is due: six jobs, six claims, each job by one worker."""
    runners = [stage_runner(engine, succeed, worker=f"worker-{i}") for i in range(8)]
    pipelines = {add_job(runners[0]) for _ in range(6)}

    def claim_all(i: int) -> list[runner.Claim]:
        claims = []
        while (claim := runners[i].claim_next()) is not None:
            claims.append(claim)
        return claims

    claims = [claim for claimed in race(len(runners), claim_all) for claim in claimed]
    end_spans(claims)

    assert sorted(claim.job.pipeline_id for claim in claims) == sorted(pipelines)
    for pipeline_id in pipelines:
        assert len(attempt_rows(engine, pipeline_id)) == 1
        assert facts(engine, pipeline_id) == [("started", 1)]


def test_a_retryable_failure_waits_its_backoff_then_is_claimed_again(engine):
    """Attempt 1 fails retryably.

    RETRY_WAIT with due_at one backoff (1 s) ahead, a StageRetrying event announcing it, no claim before it is due;
    attempt 2 is claimed once due and succeeds.
    """
    work = Script(errors.RetryableProviderError("busy", "provider busy"))
    stage = stage_runner(engine, work, backoff_s=1.0)
    pipeline_id = add_job(stage)

    stage.execute(stage.claim_next())

    job = job_row(engine, pipeline_id)
    assert (job.status, job.attempts, job.last_error_code, job.lease_owner) == ("RETRY_WAIT", 1, "busy", None)
    assert job.due_at - job.updated_at == dt.timedelta(seconds=1)
    [(_, started), (kind, retrying)] = emitted(engine, pipeline_id)
    assert kind == "lyric.retrying"
    assert (retrying["attempt"], retrying["max_attempts"], retrying["error_code"]) == (1, 3, "busy")
    assert dt.datetime.fromisoformat(retrying["next_attempt_at"]) == job.due_at
    assert stage.claim_next() is None, "claimed a second before it was due"

    claim = waits.until(stage.claim_next, timeout_s=5, interval_s=0.05, what="the retry claimed once due")
    stage.execute(claim)

    first, second = attempt_rows(engine, pipeline_id)
    assert (first.outcome, first.error_code, second.outcome) == ("failed_retryable", "busy", "succeeded")
    assert second.started_at >= job.due_at
    assert status_of(engine, pipeline_id) is Status.SUCCEEDED
    assert facts(engine, pipeline_id) == [("started", 1), ("retrying", 1), ("started", 2), ("completed", 2)]
    assert work.calls == 2


def test_when_attempts_run_out_the_job_fails_with_a_stage_failed_event(engine, run_scheduler):
    """Every attempt fails retryably.

    The pipeline's own limit (3, under the service's 5) ends it: FAILED after three attempt rows, the last event a
    StageFailed of attempt 3.
    """
    work = Script(*(errors.RetryableProviderError("flaky", f"try {n}") for n in range(1, 10)))
    stage = stage_runner(engine, work, max_attempts=5)
    pipeline_id = add_job(stage, max_attempts={events.Stage.LYRIC: 3})
    run_scheduler(stage)

    waits.until(lambda: status_of(engine, pipeline_id).terminal, what="the job ended")

    job = job_row(engine, pipeline_id)
    assert (job.status, job.attempts, job.max_attempts) == ("FAILED", 3, 3)
    assert job.finished_at is not None
    assert [(a.number, a.outcome, a.error_code) for a in attempt_rows(engine, pipeline_id)] == [
        (n, "failed_retryable", "flaky") for n in (1, 2, 3)
    ]
    assert facts(engine, pipeline_id) == [
        ("started", 1),
        ("retrying", 1),
        ("started", 2),
        ("retrying", 2),
        ("started", 3),
        ("failed", 3),
    ]
    kind, failed = emitted(engine, pipeline_id)[-1]
    assert (kind, failed["error_code"], failed["error_message"]) == ("lyric.failed", "flaky", "try 3")
    assert work.calls == 3


def test_a_non_retryable_error_fails_the_job_at_once(engine, run_scheduler):
    """A permanent provider error on attempt 1 of 3 ends the job: no retry, one attempt row."""
    work = Script(errors.PermanentProviderError("bad_brief", "cannot sing this"))
    stage = stage_runner(engine, work)
    pipeline_id = add_job(stage)
    run_scheduler(stage)

    waits.until(lambda: status_of(engine, pipeline_id).terminal, what="the job ended")

    assert status_of(engine, pipeline_id) is Status.FAILED
    assert [(a.outcome, a.error_code) for a in attempt_rows(engine, pipeline_id)] == [("failed", "bad_brief")]
    assert facts(engine, pipeline_id) == [("started", 1), ("failed", 1)]
    assert work.calls == 1


def test_an_expired_lease_is_recovered_by_another_runner_and_the_job_completes(engine, run_scheduler):
    """Worker A claims and dies (no heartbeat, 0.5 s lease).

    Worker B's scheduler hands the attempt back once the lease expired, uncounted, and completes the job. A's late
    result changes nothing.
    """
    dead = stage_runner(engine, succeed, worker="worker-a", lease_s=0.5)
    pipeline_id = add_job(dead)
    zombie = dead.claim_next()
    assert zombie is not None
    run_scheduler(stage_runner(engine, succeed, worker="worker-b"))

    waits.until(lambda: status_of(engine, pipeline_id) is Status.SUCCEEDED, what="B completed the job")

    lost, done = attempt_rows(engine, pipeline_id)
    assert (lost.worker, lost.outcome, lost.error_code) == ("worker-a", "interrupted", "lease_expired")
    assert lost.finished_at - lost.started_at >= dt.timedelta(seconds=0.5)
    assert (done.worker, done.outcome) == ("worker-b", "succeeded")
    assert facts(engine, pipeline_id) == [("started", 1), ("retrying", 1), ("started", 2), ("completed", 2)]
    # A lost worker is the machinery's failure: attempt 1 is not charged, so attempts up to 4 of 3 may run.
    assert job_row(engine, pipeline_id).counted_attempts == 1
    assert emitted(engine, pipeline_id)[1][1]["max_attempts"] == 4

    before = (job_row(engine, pipeline_id), attempt_rows(engine, pipeline_id), emitted(engine, pipeline_id))
    dead.execute(zombie)  # the dead worker wakes up and reports a result for its lost claim
    assert (job_row(engine, pipeline_id), attempt_rows(engine, pipeline_id), emitted(engine, pipeline_id)) == before


def provider_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("provider-")]


def test_a_hung_provider_call_is_cancelled_at_its_timeout_and_really_stops(engine):
    """A provider call that would never return ends after attempt_timeout_s (0.5 s).

    Its work is cancelled and gone, the attempt is a retryable attempt_timeout, and the worker is free again.
    """
    cancelled: list[cancellation.Reason | None] = []

    def hang(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        try:
            cancel.sleep(None)
        finally:
            cancelled.append(cancel.reason)
        return output()

    stage = stage_runner(engine, hang, attempt_timeout_s=0.5)
    pipeline_id = add_job(stage)
    claim = stage.claim_next()
    assert claim is not None

    started = time.monotonic()
    stage.execute(claim)
    elapsed = time.monotonic() - started

    assert 0.5 <= elapsed < 3
    assert cancelled == [cancellation.Reason.TIMEOUT]
    assert provider_threads() == []
    job = job_row(engine, pipeline_id)
    assert (job.status, job.last_error_code, job.counted_attempts) == ("RETRY_WAIT", "attempt_timeout", 1)
    assert [(a.outcome, a.error_code) for a in attempt_rows(engine, pipeline_id)] == [
        ("failed_retryable", "attempt_timeout")
    ]
    assert facts(engine, pipeline_id) == [("started", 1), ("retrying", 1)]


def test_hangs_never_push_concurrency_past_its_setting(engine, run_scheduler):
    """Six jobs on two slots.

    Every provider call hangs until cancelled at 0.3 s, then the retries succeed. At no time do more than two
    provider calls run, and none is left running.
    """
    lock = threading.Lock()
    running, most = [0], [0]

    def hang_then_succeed(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            if job.attempts == 1:
                cancel.sleep(None)
            return output()
        finally:
            with lock:
                running[0] -= 1

    stage = stage_runner(engine, hang_then_succeed, attempt_timeout_s=0.3)
    pipelines = [add_job(stage) for _ in range(6)]
    run_scheduler(stage)

    waits.until(lambda: all(status_of(engine, p) is Status.SUCCEEDED for p in pipelines), timeout_s=20)

    assert most[0] == 2
    assert running[0] == 0 and provider_threads() == []


def test_a_provider_that_ignores_its_cancellation_keeps_its_slot_until_it_returns(engine, run_scheduler):
    """One slot. The first call ignores its cancellation and returns 1.5 s later.

    Its attempt is recorded as timed out at once, but the next job starts only after that call has returned.
    """
    calls: list[tuple[str, float, float]] = []

    def stubborn(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        started = time.monotonic()
        if not calls:
            time.sleep(1.5)  # deaf to `cancel`
        calls.append((job.pipeline_id, started, time.monotonic()))
        return output()

    stage = stage_runner(engine, stubborn, attempt_timeout_s=0.2, cancel_grace_s=0.2, backoff_s=10.0)
    first = add_job(stage)
    second = add_job(stage)
    jobs = scheduler.JobScheduler(stage, concurrency=1, poll_s=0.05)
    jobs.start()
    try:
        waits.until(lambda: status_of(engine, second) is Status.SUCCEEDED, timeout_s=10)
    finally:
        jobs.stop()

    (p1, _, first_ended), (p2, second_started, _) = calls
    assert (p1, p2) == (first, second)
    assert second_started >= first_ended
    assert (job_row(engine, first).status, job_row(engine, first).last_error_code) == ("RETRY_WAIT", "attempt_timeout")


def test_a_stopping_service_hands_back_its_running_attempt_uncounted(engine):
    """A scheduler stops while an attempt runs.

    After its grace period the work is cancelled and the attempt handed back (interrupted, worker_stopped, not
    counted), due at once; the next worker takes it at once and finishes it as attempt 2 with the whole budget.
    """
    entered = threading.Event()

    def endless(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        entered.set()
        cancel.sleep(None)
        return output()

    stopping = stage_runner(engine, endless, worker="worker-a")
    pipeline_id = add_job(stopping)
    jobs = scheduler.JobScheduler(stopping, concurrency=1, poll_s=0.05, grace_s=0.3)
    jobs.start()
    assert entered.wait(5)

    started = time.monotonic()
    jobs.stop()

    assert time.monotonic() - started < 3
    job = job_row(engine, pipeline_id)
    assert (job.status, job.attempts, job.counted_attempts, job.lease_owner) == ("RETRY_WAIT", 1, 0, None)
    assert job.due_at <= job.updated_at
    [attempt] = attempt_rows(engine, pipeline_id)
    assert (attempt.outcome, attempt.error_code, attempt.worker) == ("interrupted", "worker_stopped", "worker-a")
    kind, retrying = emitted(engine, pipeline_id)[-1]
    assert (kind, retrying["error_code"], retrying["max_attempts"]) == ("lyric.retrying", "worker_stopped", 4)

    successor = stage_runner(engine, succeed, worker="worker-b")
    claim = successor.claim_next()
    assert claim is not None and claim.job.attempts == 2
    successor.execute(claim)
    job = job_row(engine, pipeline_id)
    assert (job.status, job.attempts, job.counted_attempts) == ("SUCCEEDED", 2, 1)


def test_an_outage_inside_the_work_hands_the_attempt_back_and_costs_nothing(engine, run_scheduler):
    """The disk is full on the first try.

    An outage, not the work's fault. Handed back after a backoff, not counted; the next try succeeds. With
    max_attempts=1 a counted failure would have ended it.
    """
    work = Script(OSError(errno.ENOSPC, "No space left on device"))
    stage = stage_runner(engine, work, max_attempts=1)
    pipeline_id = add_job(stage)
    run_scheduler(stage)

    waits.until(lambda: status_of(engine, pipeline_id) is Status.SUCCEEDED, what="the retry after the outage")

    assert [(a.outcome, a.error_code) for a in attempt_rows(engine, pipeline_id)] == [
        ("interrupted", "outage"),
        ("succeeded", None),
    ]
    assert job_row(engine, pipeline_id).counted_attempts == 1


def test_the_finish_of_an_attempt_rides_out_a_database_outage(engine, installation):
    """The database goes away as the work returns, for longer than the lease.

    The outcome is recorded once it is back, as the attempt's own success; nothing is lost to lease recovery.
    """
    url = installation.database_urls["lyric"]

    def succeed_into_an_outage(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        outage.block(url)
        threading.Timer(2.5, outage.unblock, [url]).start()
        return output()

    stage = stage_runner(engine, succeed_into_an_outage, lease_s=1.0)
    pipeline_id = add_job(stage)
    claim = stage.claim_next()
    assert claim is not None

    stage.execute(claim)

    assert status_of(engine, pipeline_id) is Status.SUCCEEDED
    assert [(a.number, a.outcome) for a in attempt_rows(engine, pipeline_id)] == [(1, "succeeded")]
    assert facts(engine, pipeline_id) == [("started", 1), ("completed", 1)]


def test_a_lost_claim_cancels_the_work_and_records_nothing(engine):
    """Somebody else moves the job on (here: its version bumped, as a takeover does).

    The heartbeat notices within a third of the lease, the work is cancelled, and this worker records nothing.
    """
    reasons: list[cancellation.Reason | None] = []
    entered = threading.Event()

    def wait(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        entered.set()
        try:
            cancel.sleep(30)
        finally:
            reasons.append(cancel.reason)
        return output()

    stage = stage_runner(engine, wait, lease_s=0.6)
    pipeline_id = add_job(stage)
    claim = stage.claim_next()
    assert claim is not None
    thread = threading.Thread(target=stage.execute, args=(claim,))
    thread.start()
    assert entered.wait(5)
    with engine.begin() as conn:
        conn.execute(sa.update(tables.jobs).values(version=tables.jobs.c.version + 1))

    thread.join(5)

    assert not thread.is_alive()
    assert reasons == [cancellation.Reason.SUPERSEDED]
    [attempt] = attempt_rows(engine, pipeline_id)
    assert attempt.outcome == "running"
    assert facts(engine, pipeline_id) == [("started", 1)]


def test_a_worker_never_recovers_the_lease_of_an_attempt_it_is_still_running(engine):
    """A worker's look for lost leases skips the attempts it still runs; another worker's takes them.

    After an outage longer than the lease, the worker's own attempts are renewed by their heartbeat.
    """
    release = threading.Event()

    def wait(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        release.wait(10)
        return output()

    own = stage_runner(engine, wait, worker="worker-a", lease_s=30)
    add_job(own)
    claim = own.claim_next()
    assert claim is not None
    thread = threading.Thread(target=own.execute, args=(claim,))
    thread.start()
    try:
        waits.until(lambda: own.active_jobs() == [claim.job.id])
        with engine.begin() as conn:
            conn.execute(sa.update(tables.jobs).values(lease_expires_at=sa.func.now() - sa.text("interval '1 s'")))

        assert own.recover_expired_leases() == 0
        assert stage_runner(engine, succeed, worker="worker-b").recover_expired_leases() == 1
    finally:
        release.set()
        thread.join(10)


def test_slow_but_alive_attempts_keep_renewing_their_leases_and_are_not_stolen(engine):
    """Slow but alive attempts keep renewing their leases and are not stolen.

    Two attempts run for several times their 0.6 s lease while another worker keeps looking for lost leases and due
    jobs: one heartbeat thread keeps moving both leases ahead, nobody steals the jobs, and they succeed on their
    first attempt.
    """
    finish = threading.Event()

    def slow(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        finish.wait(timeout=30)
        return output()

    alive = stage_runner(engine, slow, worker="worker-a", lease_s=0.6)
    thief = stage_runner(engine, succeed, worker="worker-b")
    pipeline_ids = [add_job(alive), add_job(alive)]
    claims = [alive.claim_next(), alive.claim_next()]
    stop = threading.Event()
    stolen: list[object] = []

    def look_for_lost_work() -> None:
        while not stop.wait(0.05):
            if recovered := thief.recover_expired_leases():
                stolen.append(recovered)
            if (taken := thief.claim_next()) is not None:
                taken.span.end()
                stolen.append(taken)

    leases: dict[str, set[dt.datetime]] = {pipeline_id: set() for pipeline_id in pipeline_ids}
    claimed = time.monotonic()

    def outlived_their_leases_thrice() -> bool:
        for pipeline_id, seen in leases.items():
            seen.add(job_row(engine, pipeline_id).lease_expires_at)
        return time.monotonic() - claimed > 3 * 0.6 and all(len(seen) >= 6 for seen in leases.values())

    def lease_threads() -> set[threading.Thread]:
        return {thread for thread in threading.enumerate() if thread.name.endswith("-leases")}

    others = lease_threads()  # of earlier runners, still idling
    threads = [threading.Thread(target=alive.execute, args=(claim,)) for claim in claims]
    threads.append(threading.Thread(target=look_for_lost_work))
    for thread in threads:
        thread.start()
    try:
        waits.until(outlived_their_leases_thrice, timeout_s=10, what="1.8 s of attempts, each lease renewed 5 times")
        assert len(lease_threads() - others) == 1
    finally:
        finish.set()
        stop.set()
        for thread in threads:
            thread.join(timeout=10)

    assert stolen == []
    for pipeline_id in pipeline_ids:
        assert status_of(engine, pipeline_id) is Status.SUCCEEDED
        assert [(a.number, a.worker, a.outcome) for a in attempt_rows(engine, pipeline_id)] == [
            (1, "worker-a", "succeeded")
        ]
        assert facts(engine, pipeline_id) == [("started", 1), ("completed", 1)]


def first_look_done(jobs: scheduler.JobScheduler) -> None:
    """Wait until the scheduler's first look found nothing due.

    Until then a trigger reserves no slot (work that waited longer may be due).
    """
    waits.until(jobs.reserve, what="the scheduler's first look done")
    jobs.release()


def trigger(stage: runner.StageRunner, jobs: scheduler.JobScheduler) -> str:
    """A pipeline.requested handled as the stage service wires its handler."""
    request = pipeline_requested()
    env = envelope.wrap(request, events.PIPELINE_REQUESTED, "/castad/api")
    handlers.StageHandlers(stage.engine, stage, jobs).on_trigger(env, request)
    return request.pipeline_id


def test_a_trigger_with_a_free_slot_starts_its_attempt_in_its_own_transaction(engine, run_scheduler):
    """No transaction of its own claims the job.

    The job, its attempt and its `started` event all have the trigger's transaction time.
    """
    stage = stage_runner(engine, succeed)
    jobs = run_scheduler(stage, concurrency=1, poll_s=60)  # the scheduler's own polls out of the way
    first_look_done(jobs)
    pipeline_id = trigger(stage, jobs)
    waits.until(lambda: status_of(engine, pipeline_id) is Status.SUCCEEDED, what="the job done")
    [attempt] = attempt_rows(engine, pipeline_id)
    with engine.connect() as conn:
        started = conn.execute(
            sa.select(tables.outbox.c.created_at).where(
                tables.outbox.c.pipeline_id == pipeline_id, tables.outbox.c.routing_key == "lyric.started"
            )
        ).scalar_one()
    assert job_row(engine, pipeline_id).created_at == attempt.started_at == started


def test_an_attempt_that_succeeds_costs_the_scheduler_no_look_for_more_work(engine, run_scheduler):
    """Its slot freed, nothing can be due for want of it: no transaction looks for work."""
    stage = stage_runner(engine, succeed)
    looks: list[float] = []
    claim_next = stage.claim_next
    stage.claim_next = lambda: looks.append(time.monotonic()) or claim_next()  # type: ignore[method-assign]
    jobs = run_scheduler(stage, concurrency=2, poll_s=60)  # the scheduler's own polls out of the way
    waits.until(lambda: looks, what="the scheduler's first look")
    waits.until(jobs.reserve, what="that look done")
    jobs.release()
    looks.clear()
    for _ in range(3):
        pipeline_id = trigger(stage, jobs)
        waits.until(lambda: status_of(engine, pipeline_id) is Status.SUCCEEDED, what="the job done")  # noqa: B023
        waits.until(jobs.reserve, what="its slot free")
        jobs.release()
    time.sleep(0.2)  # a look after the last attempt would have come by now
    assert looks == []


def test_with_work_waiting_for_a_slot_each_next_job_is_claimed_by_the_transaction_recording_the_last(
    engine, run_scheduler
):
    """No transaction of its own claims a job that waited for a slot.

    Each next attempt starts at the transaction time of its predecessor's end (the same commit), and the scheduler
    looks only once more, when the backlog has run dry.
    """
    stage = stage_runner(engine, succeed)
    pipeline_ids = [add_job(stage) for _ in range(4)]
    looks: list[float] = []
    claim_next = stage.claim_next
    stage.claim_next = lambda: looks.append(time.monotonic()) or claim_next()  # type: ignore[method-assign]
    jobs = run_scheduler(stage, concurrency=1, poll_s=60)  # the scheduler's own polls out of the way
    for pipeline_id in pipeline_ids:
        waits.until(lambda: status_of(engine, pipeline_id) is Status.SUCCEEDED, what="the job done")  # noqa: B023
    attempts = [attempt for pipeline_id in pipeline_ids for attempt in attempt_rows(engine, pipeline_id)]
    assert len(attempts) == 4
    ended = sorted(attempts, key=lambda attempt: attempt.started_at)
    for earlier, later in zip(ended, ended[1:], strict=False):
        assert later.started_at == earlier.finished_at
    waits.until(jobs.reserve, what="the slot free again")
    jobs.release()
    assert len(looks) == 2  # the first look (which took the first job), and one that found the backlog gone


def test_a_next_job_claimed_just_as_the_service_stops_is_handed_back_uncounted_and_not_run(engine, run_scheduler):
    calls: list[str] = []

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        calls.append(job.pipeline_id)
        return output()

    stage = stage_runner(engine, work)
    first, second = add_job(stage), add_job(stage)
    jobs = scheduler.JobScheduler(stage, concurrency=1, poll_s=60)

    def backlogged_then_stopping() -> bool:  # the stop begins right after the slot decided to claim more
        jobs._stopping.set()
        return True

    jobs._backlogged = backlogged_then_stopping  # type: ignore[method-assign]
    jobs.start()
    try:
        waits.until(lambda: status_of(engine, second) is not Status.PENDING, what="the second job claimed")
    finally:
        jobs.stop()
    assert calls == [first]
    assert (status_of(engine, first), status_of(engine, second)) == (Status.SUCCEEDED, Status.RETRY_WAIT)
    [attempt] = attempt_rows(engine, second)
    assert (attempt.outcome, attempt.error_code) == ("interrupted", "worker_stopped")
    assert job_row(engine, second).counted_attempts == 0


def test_a_trigger_finding_every_slot_busy_leaves_its_job_due_for_the_scheduler(engine, run_scheduler):
    release = threading.Event()

    def slow(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        release.wait(10)
        return output()

    stage = stage_runner(engine, slow)
    jobs = run_scheduler(stage, concurrency=1)
    first_look_done(jobs)
    try:
        first = trigger(stage, jobs)
        second = trigger(stage, jobs)
        assert status_of(engine, first) is Status.RUNNING
        assert status_of(engine, second) is Status.PENDING  # no slot: left due
        release.set()
        waits.until(lambda: status_of(engine, second) is Status.SUCCEEDED, what="the second job claimed later")
    finally:
        release.set()  # before the scheduler is stopped, which waits for the running attempt


def test_a_trigger_before_the_schedulers_first_look_leaves_its_job_behind_work_that_waited_longer(engine):
    """At a start, due work may be waiting (a retry, a job accepted while the service was down).

    Until the scheduler has looked, a trigger claims nothing, so its job runs after that work, not ahead of it.
    """
    calls: list[str] = []

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        calls.append(job.pipeline_id)
        return output()

    stage = stage_runner(engine, work)
    waiting = add_job(stage)
    jobs = scheduler.JobScheduler(stage, concurrency=1, poll_s=60)  # not started yet: no look so far
    arrived = trigger(stage, jobs)
    assert status_of(engine, arrived) is Status.PENDING
    jobs.start()
    try:
        waits.until(lambda: status_of(engine, arrived) is Status.SUCCEEDED, what="both jobs done")
    finally:
        jobs.stop()
    assert calls == [waiting, arrived]


def test_a_trigger_whose_transaction_fails_gives_its_slot_back(engine, run_scheduler):
    stage = stage_runner(engine, succeed)
    jobs = run_scheduler(stage, concurrency=1, poll_s=60)
    first_look_done(jobs)
    request = pipeline_requested()
    env = envelope.wrap(request, events.PIPELINE_REQUESTED, "/castad/api")
    stage_handlers = handlers.StageHandlers(stage.engine, stage, jobs)
    with outage.database_down(stage.engine.url.render_as_string(hide_password=False)), pytest.raises(Exception) as lost:
        stage_handlers.on_trigger(env, request)
    assert outages.is_outage(lost.value)
    assert jobs.reserve()  # the one slot is free again
    jobs.release()
    stage_handlers.on_trigger(env, request)  # delivered again: the job runs
    waits.until(lambda: status_of(engine, request.pipeline_id) is Status.SUCCEEDED, what="the job done")


def test_a_job_claimed_by_its_trigger_while_the_service_stops_is_handed_back_uncounted(engine, run_scheduler):
    stage = stage_runner(engine, succeed)
    jobs = run_scheduler(stage, concurrency=1, poll_s=60)
    first_look_done(jobs)
    assert jobs.reserve()
    pipeline_id = add_job(stage)
    began = stage.clock()
    with db.transaction(engine) as conn:
        claim = stage.claim_accepted(conn, pipeline_id, began)
    assert claim is not None
    stopping = threading.Thread(target=jobs.stop)  # waits for the reserved slot: it counts as running
    stopping.start()
    waits.until(lambda: jobs._stopping.is_set(), what="the scheduler stopping")
    jobs.run_claimed(claim)
    stopping.join(5)
    assert not stopping.is_alive()
    row = job_row(engine, pipeline_id)
    assert (row.status, row.counted_attempts) == (Status.RETRY_WAIT, 0)  # due again, as any handed-back attempt
    [attempt] = attempt_rows(engine, pipeline_id)
    assert (attempt.outcome, attempt.error_code) == ("interrupted", "worker_stopped")


def test_a_trigger_delivered_twice_claims_once_and_gives_its_slot_back(engine, run_scheduler):
    stage = stage_runner(engine, succeed)
    jobs = run_scheduler(stage, concurrency=1, poll_s=60)
    first_look_done(jobs)
    request = pipeline_requested()
    env = envelope.wrap(request, events.PIPELINE_REQUESTED, "/castad/api")
    stage_handlers = handlers.StageHandlers(stage.engine, stage, jobs)
    stage_handlers.on_trigger(env, request)
    waits.until(lambda: status_of(engine, request.pipeline_id) is Status.SUCCEEDED, what="the job done")
    stage_handlers.on_trigger(env, request)
    assert len(attempt_rows(engine, request.pipeline_id)) == 1
    waits.until(jobs.reserve, what="the slot free again")
    jobs.release()


def test_a_replica_of_an_earlier_release_runs_the_jobs_it_reads_and_leaves_the_others_untouched_for_a_newer_one(
    engine, caplog
):
    """Mid-rollout, two replicas of the lyric stage: this release's, and one that knows pipeline.requested up to
    version 3 (photos uploaded, none named by URL).

    A brief every release knows is stored as version 1, and the earlier replica takes and finishes it. A brief
    naming a photo by URL needs version 4: the earlier replica never claims it (no attempt, nothing counted, said
    once in its log, counted among the jobs due for a newer release) and this release's replica then does.
    """
    earlier = stage_runner(
        engine, succeed, worker="lyric@earlier", registry=events.REGISTRY.until(events.PIPELINE_REQUESTED, 3)
    )
    current = stage_runner(engine, succeed, worker="lyric@current")
    plain = add_job(current)
    linked = add_job(current, brief=briefs.sample(photos=(brief.PhotoLink(url="https://example.com/a.jpg"),)))
    assert (job_row(engine, plain).input_version, job_row(engine, linked).input_version) == (1, 4)

    claim = earlier.claim_next()
    assert claim is not None and claim.job.pipeline_id == plain
    earlier.execute(claim)
    assert earlier.claim_next() is None
    assert earlier.claim_next() is None

    assert job_row(engine, plain).status == "SUCCEEDED"
    [(_, completed)] = [entry for entry in emitted(engine, plain) if entry[0] == "lyric.completed"]
    assert completed["brief"] == briefs.sample().model_dump(mode="json")
    left = job_row(engine, linked)
    assert (left.status, left.attempts, left.counted_attempts, left.version) == ("PENDING", 0, 0, 0)
    assert attempt_rows(engine, linked) == []
    with engine.connect() as conn:
        assert claiming.counts(conn, earlier.reads).for_newer == 1
        assert claiming.counts(conn, current.reads).for_newer == 0
    said = [record.getMessage() for record in caplog.records if "newer release" in record.getMessage()]
    assert said == [
        "lyric: 1 due jobs hold a pipeline.requested newer than version 3, the newest this release reads: left,"
        " untouched, for a replica of a newer release"
    ]

    claim = current.claim_next()
    assert claim is not None and claim.job.pipeline_id == linked
    current.execute(claim)
    assert job_row(engine, linked).status == "SUCCEEDED"


def test_a_job_an_earlier_release_stored_is_read_and_run_by_this_one(engine):
    """The other way round: mid-rollout, a replica of the release before accepted the trigger (a brief with an
    uploaded photo, stored as version 3), and this release's replica takes and finishes the job."""
    earlier = stage_runner(engine, succeed, registry=events.REGISTRY.until(events.PIPELINE_REQUESTED, 3))
    current = stage_runner(engine, succeed, worker="lyric@current")
    photo = brief.Photo(id=str(uuid.uuid4()), owner="b" * 32, sha256="a" * 64, media_type="image/jpeg", size=1_000)
    pipeline_id = add_job(earlier, brief=briefs.sample(photos=(photo,)))
    assert job_row(engine, pipeline_id).input_version == 3

    claim = current.claim_next()
    assert claim is not None and claim.job.trigger(events.PipelineRequested).brief.photos == (photo,)
    current.execute(claim)

    assert job_row(engine, pipeline_id).status == "SUCCEEDED"
    [(_, completed)] = [entry for entry in emitted(engine, pipeline_id) if entry[0] == "lyric.completed"]
    assert completed["brief"]["photos"] == [photo.model_dump(mode="json")]
