"""Runs one stage's jobs through the state machine around its provider.

A stage service supplies `work` (provider call plus artifact) and the payload model of its
`completed` event; everything else (claim, lease, heartbeat, attempts, backoff, outbox events)
is the same for every stage. Here: an attempt's lifecycle (its claim, its work on a thread of its own under
supervision, its outcome recorded through an outage, its lease recovered once its worker is lost), and a trigger
or an operator's request applied in the handler's transaction. What the work returns, how an attempt is judged and
how each outcome is written: castad_runtime.stage.outcomes. What an attempt comes to and what it costs:
docs/concepts/stage-machine.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from castad_contracts import codes, events
from opentelemetry import context as otel_context
from opentelemetry import trace

from castad_runtime import consumer, db, logs, outages, telemetry
from castad_runtime import metrics as metrics_
from castad_runtime.stage import cancellation, errors, fence, leases, machine, outcomes, repository
from castad_runtime.stage.repository import claiming, operations

log = logging.getLogger(__name__)

SUPERVISE_STEP_S = 0.25  # how often a supervisor looks at its attempt's cancellation and clock
STUCK_LOG_EVERY_S = 60.0  # while a provider ignores its cancellation, say so this often
NEWER_RELEASE_LOOK_S = 60.0  # while nothing can be claimed, look this often for jobs only a newer release reads
# Error codes the runner gives itself: always label values of its metrics, never crowded out by a provider's.
OWN_CODES = frozenset(
    {
        codes.ErrorCode.ATTEMPT_TIMEOUT,
        codes.ErrorCode.INTERNAL_ERROR,
        codes.ErrorCode.WORKER_STOPPED,
        codes.ErrorCode.LEASE_EXPIRED,
        codes.ErrorCode.OUTAGE,
        codes.ErrorCode.POLL_TIMEOUT,
    }
    | {codes.ErrorCode.LEASE_LOST}
    | {codes.ErrorCode.PROVIDER_JOB_TIMEOUT, codes.ErrorCode.CANCELED}
    | errors.CALL_FAILURES
)


Work = Callable[[repository.Job, cancellation.Cancellation], outcomes.Output | outcomes.Awaiting | outcomes.Drafted]


@dataclasses.dataclass(frozen=True)
class Limits:
    policy: machine.RetryPolicy
    lease_s: float = 30.0
    attempt_timeout_s: float = 600.0
    cancel_grace_s: float = 5.0  # a cancelled provider must have stopped within this

    def __post_init__(self) -> None:
        if self.lease_s <= 0 or self.attempt_timeout_s <= 0 or self.cancel_grace_s <= 0:
            raise ValueError("lease_s, attempt_timeout_s and cancel_grace_s must be positive")


@dataclasses.dataclass
class Claim:
    job: repository.Job
    span: trace.Span
    lease_from: float  # on the leases' clock, at or before the claiming transaction began (its lease's start)
    claimed_at: float = dataclasses.field(default_factory=time.monotonic)

    def abandon(self) -> None:
        """The transaction that claimed the job did not commit: the claim never held."""
        self.span.end()

    def attempt_s(self) -> float:
        """How long its attempt has run: since this claim, and before it since the submit of a job at a provider."""
        return time.monotonic() - self.claimed_at + (self.job.waited_s if self.job.polling else 0.0)


@dataclasses.dataclass(frozen=True)
class Ran:
    """What `StageRunner.execute` came to."""

    succeeded: bool  # the job succeeded: nothing of it is due any more
    next: Claim | None = None  # claimed for the same slot by the transaction that recorded the outcome


class StageRunner:
    def __init__(
        self,
        stage: events.Stage,
        engine: sa.Engine,
        work: Work,
        completed_model: type[events.StageCompleted],
        limits: Limits,
        worker_id: str,
        rng: random.Random | None = None,
        provider: str | None = None,
        metrics: metrics_.StageMetrics | None = None,
        clock: leases.Clock = leases.clock,
        probed: bool = False,
        registry: events.Registry = events.REGISTRY,
    ) -> None:
        self.stage = stage
        self.engine = engine
        self.work = work
        self.limits = limits
        self.worker_id = worker_id
        self.provider = provider  # claims go through this provider's quota (castad_runtime.stage.quota)
        self.probed = probed  # a prober polls the jobs waiting at the provider (castad_runtime.stage.probes)
        self.registry = registry  # the event versions this release knows
        self.trigger_type = events.TRIGGERS[stage]
        # The newest version of its trigger this release reads: a job stored as a newer one is left to a newer release.
        self.reads = registry.current_version(self.trigger_type)
        self.tracer = telemetry.tracer(f"castad.{stage.value}")
        self.metrics = metrics or metrics_.StageMetrics(metrics_.registry(), stage.value, OWN_CODES)
        self._outcomes = outcomes.Outcomes(
            stage,
            completed_model,
            limits.policy,
            limits.attempt_timeout_s,
            limits.cancel_grace_s,
            rng or random.Random(),
            self.metrics,
            registry,
        )
        self._active: dict[uuid.UUID, cancellation.Cancellation] = {}
        self._leases = leases.Leases(engine, limits.lease_s, stage.value, clock)
        submitted = functools.partial(self.metrics.provider_submission, provider or "none")
        self._fence = fence.Fence(
            engine,
            self._leases,
            limits.lease_s * fence.MARGIN,
            sent=functools.partial(submitted, "sent"),
            fenced=functools.partial(submitted, "fenced"),
        )
        self._lock = threading.Lock()
        self._interrupted = threading.Event()  # the service is stopping: running attempts were cancelled
        self._give_up = threading.Event()  # stop trying to record outcomes through an outage
        self._next_look_for_newer = 0.0

    def accept(self, conn: sa.Connection, trigger: events.Payload) -> bool:
        """In the handler's transaction: record this pipeline's trigger. True if a job is now due."""
        overrides = getattr(trigger, "max_attempts", None) or {}
        max_attempts = overrides.get(self.stage, self.limits.policy.max_attempts)
        traceparent, tracestate = telemetry.current_trace_headers()
        # Stored as the oldest version that carries it whole, as an event is written: a replica of an earlier
        # release, mid-rollout, takes every job it can read.
        version, data = self.registry.oldest_carrying(self.trigger_type, trigger)
        return claiming.accept_trigger(
            conn,
            trigger.pipeline_id,
            data,
            version,
            max_attempts,
            traceparent,
            tracestate,
            getattr(trigger, "share", None),
        )

    def apply_cancel(self, conn: sa.Connection, request: events.PipelineCancelRequested) -> uuid.UUID | None:
        """Cancel this pipeline's job, or make sure it never starts one.

        In the handler's transaction: the job is canceled, or, if there is none yet, none will start. Returns the
        job whose attempt runs, if it does, to stop it at once here.
        """
        held = self._in_order(conn, request.pipeline_id, request.operation)
        if held is None:
            job_id = operations.add_canceled(
                conn, request.pipeline_id, request.operation, request.reason, self.limits.policy.max_attempts
            )
            if job_id is not None:
                self._outcomes.emit_canceled(conn, request, job_id, attempt=0)
                return None
            held = operations.lock(conn, request.pipeline_id)  # its trigger came meanwhile
            assert held is not None
        if held.status.terminal:
            operations.note_operation(conn, held, request.operation)
            return None
        operations.cancel(conn, held, request.operation, request.reason)
        if held.status in (machine.Status.RUNNING, machine.Status.AWAITING):  # its attempt ends canceled
            db.after_commit(conn, lambda: self.metrics.attempt_ended("canceled", codes.ErrorCode.CANCELED))
        self._outcomes.emit_canceled(conn, request, held.id, attempt=held.attempts)
        log.info("%s job canceled (%s)", self.stage.value, request.reason)
        return held.id if held.status is machine.Status.RUNNING else None

    def apply_retry(self, conn: sa.Connection, request: events.PipelineRetryRequested) -> bool:
        """Reopen this stage's job if the pipeline resumes here; True if a job is now due.

        In the handler's transaction. The job is reopened if the pipeline resumes at this stage or before it
        reached here.
        """
        held = self._in_order(conn, request.pipeline_id, request.operation)
        overrides = request.max_attempts or {}
        budget = overrides.get(self.stage, self.limits.policy.max_attempts)
        if held is None:
            # No trigger came yet. The request is recorded (a row WAITING for the trigger, which makes it
            # PENDING) so that the pipeline's next request is taken in order here too.
            if operations.add_waiting(conn, request.pipeline_id, request.operation, budget) is not None:
                return False
            held = operations.lock(conn, request.pipeline_id)  # its trigger came meanwhile
            assert held is not None
        resumes_here = events.STAGE_ORDER.index(self.stage) >= events.STAGE_ORDER.index(request.stage)
        if not resumes_here or held.status not in (machine.Status.FAILED, machine.Status.CANCELED):
            operations.note_operation(conn, held, request.operation)
            return False
        if held.input is None:
            operations.reopen(conn, held, request.operation, machine.Status.WAITING, budget, None)
            return False
        # Later stages get this retry's budgets from the events this stage writes next.
        job_input = {**held.input, "max_attempts": {stage.value: n for stage, n in overrides.items()} or None}
        operations.reopen(conn, held, request.operation, machine.Status.PENDING, budget, job_input)
        log.info("%s job reopened by a retry, %d attempts", self.stage.value, budget)
        return True

    def cancel_local(self, job_id: uuid.UUID) -> None:
        """Stop this job's attempt now if it runs in this process (its cancel is recorded already)."""
        with self._lock:
            running = self._active.get(job_id)
        if running is not None:
            running.cancel(cancellation.Reason.CANCELED)

    def _in_order(self, conn: sa.Connection, pipeline_id: str, operation: int) -> operations.Held | None:
        """The job (None: no row), locked; Hold if an earlier operator request of the pipeline is still to come."""
        held = operations.lock(conn, pipeline_id)
        last = held.last_operation if held else 0
        if operation != last + 1:
            raise consumer.Hold(f"operator request {operation} of {pipeline_id} came before request {last + 1}")
        return held

    def active_jobs(self) -> list[uuid.UUID]:
        """Jobs whose attempts run in this process now."""
        with self._lock:
            return list(self._active)

    def interrupt_all(self) -> int:
        """Cancel every running attempt because the service stops: each is handed back, not counted."""
        self._interrupted.set()
        with self._lock:
            running = list(self._active.values())
        for cancel in running:
            cancel.cancel(cancellation.Reason.SHUTDOWN)
        return len(running)

    def give_up_recording(self) -> None:
        """Stop retrying to record outcomes through an outage (the service is about to exit).

        The leases of those attempts run out, and whoever recovers them hands them back.
        """
        self._give_up.set()

    def claim_next(self) -> Claim | None:
        began = self._leases.clock()
        with db.transaction(self.engine) as conn:
            return self._claim_next_in(conn, began)

    def _claim_next_in(self, conn: sa.Connection, began: float) -> Claim | None:
        """Claim the most overdue claimable job in the caller's transaction.

        That transaction began at `began` or after (see `claim_accepted` on a transaction that does not commit).
        """
        job = claiming.claim_next(
            conn, self.worker_id, self.limits.lease_s, self.provider, self.probed, reads=self.reads
        )
        if isinstance(job, claiming.QuotaWait):
            assert self.provider is not None
            self.metrics.quota_wait(self.provider, job.reason)
            return None
        if job is None:
            self._say_what_waits_for_a_newer_release(conn)
            return None
        return self._claimed(conn, job, began)

    def _say_what_waits_for_a_newer_release(self, conn: sa.Connection) -> None:
        """Once a minute at most, when nothing could be claimed: the jobs due that only a newer release reads."""
        now = self._leases.clock()
        if now < self._next_look_for_newer:
            return
        self._next_look_for_newer = now + NEWER_RELEASE_LOOK_S
        left = claiming.counts(conn, self.reads).for_newer
        if left:
            log.warning(
                "%s: %d due jobs hold a %s newer than version %d, the newest this release reads: left, untouched,"
                " for a replica of a newer release",
                self.stage.value,
                left,
                self.trigger_type,
                self.reads,
            )

    def claim_accepted(self, conn: sa.Connection, pipeline_id: str, began: float) -> Claim | None:
        """Claim the job `accept` made due, at once, in the trigger's transaction.

        Not when a provider's quota decides what may start. `began`: a time of `clock()` before that transaction
        began. The claim holds only once the transaction committed; if it does not, end the claim's span
        (`Claim.abandon`).
        """
        if not self.claims_at_trigger:
            return None
        job = claiming.claim_pending(conn, pipeline_id, self.worker_id, self.limits.lease_s)
        return None if job is None else self._claimed(conn, job, began)

    def clock(self) -> float:
        """The time on the clock the leases are known by (see castad_runtime.stage.leases)."""
        return self._leases.clock()

    @property
    def claims_at_trigger(self) -> bool:
        """Whether a trigger's handler may claim its job (see claim_accepted)."""
        return self.provider is None

    def hand_back(self, claim: Claim, why: str) -> None:
        """A claim whose attempt will not run here: handed back at once (outcome interrupted, not counted)."""
        with trace.use_span(claim.span, end_on_exit=True):
            back = outcomes.HandedBack(codes.ErrorCode.WORKER_STOPPED, why)
            if self._record(claim.job, back)[0]:
                self._count(back, claim.job.polling, 0.0)

    def _claimed(self, conn: sa.Connection, job: repository.Job, began: float) -> Claim:
        """The claim of `job` (its span), and its `started` event unless it goes on with a submitted attempt."""
        span = self.tracer.start_span(
            f"{self.stage.value} {'poll' if job.polling else 'attempt'}",
            context=telemetry.context_from(job.traceparent, job.tracestate),
            attributes={"castad.pipeline_id": job.pipeline_id, "castad.attempt": job.attempts},
        )
        if not job.polling:
            with trace.use_span(span):
                self.emit(conn, job, "started", events.StageStarted, started_at=_now(), worker=self.worker_id)
        return Claim(job, span, began)

    def execute(self, claim: Claim, claim_next: Callable[[], bool] = lambda: False) -> Ran:
        """Run the claimed attempt and record its outcome.

        Returns once its work has stopped (so a slot of the scheduler is never given to a new attempt while an old
        one still runs).

        `claim_next()` says whether to look for more work: if it does once the work has stopped, the
        transaction that records the outcome also claims the most overdue job for this slot (`Ran.next`),
        sparing that claim a transaction of its own."""
        job = claim.job
        succeeded = False
        following: Claim | None = None
        cancel = cancellation.Cancellation(before_leaving=functools.partial(self._fence.let_go, job))
        with self._lock:
            self._active[job.id] = cancel
        try:
            with trace.use_span(claim.span, end_on_exit=True), logs.bound(job.pipeline_id):
                if job.polling:
                    log.debug("%s attempt %d: polling %s", self.stage.value, job.attempts, job.handle)
                else:
                    log.info("%s attempt %d started", self.stage.value, job.attempts)
                self._leases.hold(job, lambda: cancel.cancel(cancellation.Reason.SUPERSEDED), claim.lease_from)
                try:
                    worker, result = self._start_work(job, cancel)
                    ended = self._supervise(worker, cancel)
                    outcome = self._outcomes.judge(job, result, cancel, ended)
                    if outcome is not None:
                        recorded, following = self._record(job, outcome, claim_next if ended else None)
                        if recorded:
                            self._count(outcome, job.polling, claim.attempt_s())
                            succeeded = isinstance(outcome, outcomes.Succeeded)
                finally:
                    self._leases.release(job.id)
                self._wait_until_stopped(worker, job)
        except BaseException:
            if following is not None:  # committed, but nobody will run it: handed back at once, not counted
                self.hand_back(following, "its slot failed after claiming it")
            raise
        finally:
            with self._lock:
                self._active.pop(job.id, None)
        return Ran(succeeded, following)

    def recover_expired_leases(self, limit: int = 20) -> int:
        """Jobs whose worker stopped renewing its lease: the attempt is handed back, not counted."""
        with db.transaction(self.engine) as conn:
            lost = claiming.expired_leases(conn, limit, exclude=self.active_jobs())
            for job in lost:
                with telemetry.continued(job.traceparent, job.tracestate), logs.bound(job.pipeline_id):
                    log.warning("%s attempt %d lost its lease; handing it back", self.stage.value, job.attempts)
                    back = outcomes.HandedBack(codes.ErrorCode.LEASE_EXPIRED, "the worker stopped renewing its lease")
                    if self._outcomes.write_hand_back(conn, job, back):
                        db.after_commit(conn, functools.partial(self._count, back, job.polling, None))
        return len(lost)

    def _start_work(
        self, job: repository.Job, cancel: cancellation.Cancellation
    ) -> tuple[threading.Thread, dict[str, Any]]:
        """The provider runs on a thread of its own, so that its supervisor can time it out."""
        result: dict[str, Any] = {}
        parent = otel_context.get_current()

        def target() -> None:
            token = otel_context.attach(parent)
            try:
                result["output"] = self.work(job, cancel)
            except BaseException as error:  # handed to the supervisor
                result["error"] = error
            finally:
                otel_context.detach(token)

        worker = threading.Thread(target=target, name=f"provider-{job.id}", daemon=True)
        worker.start()
        return worker, result

    def _supervise(self, worker: threading.Thread, cancel: cancellation.Cancellation) -> bool:
        """Wait for the work, cancelling it when its time is up; True if it has stopped."""
        deadline = time.monotonic() + self.limits.attempt_timeout_s
        while worker.is_alive() and cancel.reason is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                cancel.cancel(cancellation.Reason.TIMEOUT)
                break
            worker.join(min(remaining, SUPERVISE_STEP_S))
        worker.join(self.limits.cancel_grace_s)
        return not worker.is_alive()

    def _record(
        self, job: repository.Job, outcome: outcomes.Outcome, claim_next: Callable[[], bool] | None = None
    ) -> tuple[bool, Claim | None]:
        """Record the outcome through an outage, and claim the next job in that transaction if asked.

        The next job is claimed if `claim_next()` says so. Returns whether the outcome was recorded (not if the job
        moved on, or the service stops), and that claim.
        """

        def write() -> tuple[bool, Claim | None]:
            following: Claim | None = None
            began = self._leases.clock()
            try:
                with db.transaction(self.engine) as conn:
                    recorded = self._outcomes.write(conn, job, outcome)
                    if recorded and self.provider is not None:
                        outcomes.feed_quota(conn, self.provider, outcome)
                    if claim_next is not None and claim_next():
                        following = self._claim_next_in(conn, began)
            except BaseException:
                if following is not None:
                    following.abandon()
                raise
            return recorded, following

        what = f"{self.stage.value} attempt {job.attempts}: recording its outcome"
        try:
            recorded, following = outages.keep_trying(write, what, stop=self._give_up, first_s=0.2)
        except outages.Stopped:
            log.warning("%s attempt %d: stopping with its outcome unrecorded", self.stage.value, job.attempts)
            return False, None
        if not recorded:
            log.warning("%s attempt %d: not recorded, the job has moved on", self.stage.value, job.attempts)
        return recorded, following

    def _count(self, outcome: outcomes.Outcome, polling: bool, attempt_s: float | None) -> None:
        """A recorded outcome in the metrics.

        The attempt's end (as the attempts table has it), if it ended, and the provider's "too many".
        """
        if getattr(outcome, "throttled_s", None) is not None and self.provider is not None:
            self.metrics.provider_throttled(self.provider)
        if isinstance(outcome, outcomes.Succeeded):
            self.metrics.attempt_ended("succeeded", None, attempt_s)
        elif isinstance(outcome, outcomes.Failed):
            self.metrics.attempt_ended("failed_retryable" if outcome.retryable else "failed", outcome.code, attempt_s)
        elif isinstance(outcome, outcomes.HandedBack) and not polling:  # a poll handed back is only due again
            self.metrics.attempt_ended("interrupted", outcome.code, attempt_s)

    def complete_review(
        self, conn: sa.Connection, job: repository.Job, output: outcomes.Output, decided: dict[str, Any]
    ) -> None:
        """In the caller's transaction: the job in REVIEW, locked, SUCCEEDED with `output`, as `decided`."""
        self._outcomes.complete_review(conn, job, output, decided)

    def emit(self, conn: sa.Connection, job: repository.Job, fact: Any, model: type[Any], **fields: Any) -> None:
        """In the caller's transaction: the event of `fact` about `job`'s attempt, in the outbox (Outcomes.emit)."""
        self._outcomes.emit(conn, job, fact, model, **fields)

    def _wait_until_stopped(self, worker: threading.Thread, job: repository.Job) -> None:
        """Hold the slot while a provider that ignores its cancellation still runs (unless the service stops)."""
        while worker.is_alive() and not self._interrupted.is_set():
            worker.join(STUCK_LOG_EVERY_S)
            if worker.is_alive():
                log.error(
                    "%s provider of attempt %d still running after its cancellation", self.stage.value, job.attempts
                )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
