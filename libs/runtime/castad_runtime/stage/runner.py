"""Runs one stage's jobs through the state machine around its provider.

A stage service supplies `work` (provider call plus artifact) and the payload model
of its `completed` event; everything else (claim, lease, heartbeat, attempts,
backoff, outbox events) is here, the same for every stage.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from castad_contracts import events
from opentelemetry import trace

from castad_runtime import db, logs, outbox, telemetry
from castad_runtime.stage import errors, machine, repository

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Output:
    """What a successful attempt made: the artifact and the stage's extra payload fields."""

    artifact: events.Artifact
    details: dict[str, Any]


Work = Callable[[repository.Job], Output]


@dataclasses.dataclass(frozen=True)
class Limits:
    policy: machine.RetryPolicy
    lease_s: float = 30.0
    attempt_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.lease_s <= 0 or self.attempt_timeout_s <= 0:
            raise ValueError("lease_s and attempt_timeout_s must be positive")


@dataclasses.dataclass
class Claim:
    job: repository.Job
    span: trace.Span


class AttemptTimeout(Exception):
    pass


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
    ) -> None:
        self.stage = stage
        self.engine = engine
        self.work = work
        self.completed_model = completed_model
        self.limits = limits
        self.worker_id = worker_id
        self.source = f"/castad/{stage.value}"
        self.tracer = telemetry.tracer(f"castad.{stage.value}")
        self.rng = rng or random.Random()

    def accept(self, conn: sa.Connection, trigger: events.Payload) -> bool:
        """In the handler's transaction: create this pipeline's job. False if it exists already."""
        overrides = getattr(trigger, "max_attempts", None) or {}
        max_attempts = overrides.get(self.stage, self.limits.policy.max_attempts)
        traceparent, tracestate = telemetry.current_trace_headers()
        job_id = repository.create(
            conn, trigger.pipeline_id, trigger.model_dump(mode="json"), max_attempts, traceparent, tracestate
        )
        return job_id is not None

    def claim_next(self) -> Claim | None:
        with db.transaction(self.engine) as conn:
            job = repository.claim_next(conn, self.worker_id, self.limits.lease_s)
            if job is None:
                return None
            span = self.tracer.start_span(
                f"{self.stage.value} attempt",
                context=telemetry.context_from(job.traceparent, job.tracestate),
                attributes={"castad.pipeline_id": job.pipeline_id, "castad.attempt": job.attempts},
            )
            with trace.use_span(span):
                self._emit(conn, job, "started", events.StageStarted, started_at=_now())
        return Claim(job, span)

    def execute(self, claim: Claim) -> None:
        job = claim.job
        with trace.use_span(claim.span, end_on_exit=True), logs.bound(job.pipeline_id):
            log.info("%s attempt %d of %d started", self.stage.value, job.attempts, job.max_attempts)
            heartbeat = _Heartbeat(self.engine, job, self.limits.lease_s)
            heartbeat.start()
            try:
                output = _call_with_timeout(self.work, job, self.limits.attempt_timeout_s)
            except errors.ProviderError as error:
                self._failed(job, error.code, error.message, error.retryable)
            except AttemptTimeout:
                message = f"no result within {self.limits.attempt_timeout_s:g} s"
                self._failed(job, "attempt_timeout", message, True)
            except Exception as error:  # a bug or an unexpected provider error: retry, but say so
                log.exception("%s attempt crashed", self.stage.value)
                self._failed(job, "internal_error", f"{type(error).__name__}: {error}", True)
            else:
                self._succeeded(job, output)
            finally:
                heartbeat.stop()

    def recover_expired_leases(self, limit: int = 20) -> int:
        """Jobs whose worker stopped renewing its lease: count the attempt as lost and retry."""
        with db.transaction(self.engine) as conn:
            lost = repository.expired_leases(conn, limit)
            for job in lost:
                with telemetry.continued(job.traceparent, job.tracestate), logs.bound(job.pipeline_id):
                    log.warning("%s attempt %d lost its lease; recovering", self.stage.value, job.attempts)
                    self._record_failure(conn, job, "lease_expired", "the worker stopped renewing its lease", True)
        return len(lost)

    def _succeeded(self, job: repository.Job, output: Output) -> None:
        with db.transaction(self.engine) as conn:
            result = {"artifact": output.artifact.model_dump(mode="json")}
            if not repository.finish_attempt(conn, job, machine.Status.SUCCEEDED, "succeeded", result=result):
                log.warning("%s attempt %d finished after losing its claim", self.stage.value, job.attempts)
                return
            trigger = job.input
            self._emit(
                conn,
                job,
                "completed",
                self.completed_model,
                artifact=output.artifact,
                completed_at=_now(),
                brief=trigger["brief"],
                max_attempts=trigger.get("max_attempts"),
                **output.details,
            )
        log.info("%s succeeded on attempt %d", self.stage.value, job.attempts)

    def _failed(self, job: repository.Job, code: str, message: str, retryable: bool) -> None:
        with db.transaction(self.engine) as conn:
            self._record_failure(conn, job, code, message, retryable)

    def _record_failure(
        self, conn: sa.Connection, job: repository.Job, code: str, message: str, retryable: bool
    ) -> None:
        decision = machine.after_failure(self.limits.policy, job.attempts, job.max_attempts, retryable, self.rng)
        outcome = "failed_retryable" if retryable else "failed"
        done = repository.finish_attempt(
            conn,
            job,
            decision.status,
            outcome,
            error_code=code,
            error_message=message[:2000],
            retry_in_s=decision.delay_s,
        )
        if not done:
            return
        if decision.status is machine.Status.RETRY_WAIT:
            log.warning(
                "%s attempt %d failed (%s); retry in %.2f s", self.stage.value, job.attempts, code, decision.delay_s
            )
            self._emit(
                conn,
                job,
                "retrying",
                events.StageRetrying,
                max_attempts=job.max_attempts,
                error_code=code,
                error_message=message[:2000],
                next_attempt_at=repository.due_at(conn, job.id),
            )
        else:
            log.error("%s failed for good on attempt %d: %s", self.stage.value, job.attempts, code)
            self._emit(
                conn,
                job,
                "failed",
                events.StageFailed,
                error_code=code,
                error_message=message[:2000],
                failed_at=_now(),
            )

    def _emit(self, conn: sa.Connection, job: repository.Job, fact: Any, model: type[Any], **fields: Any) -> None:
        payload = model(
            pipeline_id=job.pipeline_id, stage=self.stage, job_id=str(job.id), attempt=job.attempts, **fields
        )
        outbox.add(conn, payload, events.stage_event(self.stage, fact), self.source)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _call_with_timeout(work: Work, job: repository.Job, timeout_s: float) -> Output:
    """Run the provider on a daemon thread so that a hung call cannot hold the worker forever."""
    box: dict[str, Any] = {}
    context = trace.set_span_in_context(trace.get_current_span())

    def target() -> None:
        from opentelemetry import context as otel_context

        token = otel_context.attach(context)
        try:
            box["output"] = work(job)
        except BaseException as error:  # handed to the caller's thread
            box["error"] = error
        finally:
            otel_context.detach(token)

    thread = threading.Thread(target=target, name=f"provider-{job.id}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise AttemptTimeout()
    if "error" in box:
        raise box["error"]
    return box["output"]


class _Heartbeat:
    """Renews the job's lease every third of its length until stopped."""

    def __init__(self, engine: sa.Engine, job: repository.Job, lease_s: float) -> None:
        self.engine = engine
        self.job = job
        self.lease_s = lease_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{job.id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                with db.transaction(self.engine) as conn:
                    if not repository.renew_lease(conn, self.job, self.lease_s):
                        log.warning("lease of job %s was taken over", self.job.id)
                        return
            except sa.exc.SQLAlchemyError:
                log.exception("heartbeat failed; will try again")
