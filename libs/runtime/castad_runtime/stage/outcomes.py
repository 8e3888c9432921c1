"""What an attempt comes to, and how each outcome is written into its job's row and the outbox.

A stage's work (castad_runtime.stage.runner.Work) returns an Output, or Awaiting (its work is at a provider) or
Drafted (a draft for a person's review); an attempt that fails is judged (castad_runtime.stage.failures) Failed,
counted against its job's attempts, or HandedBack, not counted. Outcomes writes each outcome in the caller's
transaction: the job moved on by its claim (castad_runtime.stage.repository), and the stage's event about it in
the outbox. The attempt's lifecycle around it (claim, lease, supervision, recording through an outage):
castad_runtime.stage.runner.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
import uuid
from typing import Any

import pydantic
import sqlalchemy as sa
from castad_contracts import brief, codes, events, topology

from castad_runtime import db, outbox
from castad_runtime import metrics as metrics_
from castad_runtime.stage import cancellation, errors, failures, machine, quota, repository
from castad_runtime.stage.repository import attempts, drafts

log = logging.getLogger(__name__)

ERROR_MESSAGE_MAX = 2000
FREE_RATE_LIMITS = 20  # attempts a provider may turn away with "too many" before they count


@dataclasses.dataclass(frozen=True)
class Output:
    """What a successful attempt made: the artifact and the stage's extra payload fields."""

    artifact: events.Artifact
    details: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Awaiting:
    """The work is at a provider under `handle`.

    Poll it in `poll_in_s`. `throttled_s`: the provider said "too many" on the way (its Retry-After, 0 if it gave
    none); `notes`: its warnings on the submission.
    """

    handle: str
    poll_in_s: float
    throttled_s: float | None = None
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Drafted:
    """The work made a draft for a person to decide on, as `review` asks (castad_runtime.stage.reviews).

    `output` is what the stage completes with if the draft is approved as it is."""

    output: Output
    review: brief.Review


@dataclasses.dataclass(frozen=True)
class Succeeded:
    output: Output


@dataclasses.dataclass(frozen=True)
class Failed:
    """The work failed: counted against max_attempts."""

    code: codes.ErrorCode
    message: str
    retryable: bool
    retry_after_s: float | None = None


@dataclasses.dataclass(frozen=True)
class HandedBack:
    """The machinery failed the attempt, or the provider asked us to slow down (`throttled_s`).

    Not counted, the job is due again after `delay_s` (its poll, if its work is at a provider).
    """

    code: codes.ErrorCode
    message: str
    delay_s: float = 0.0
    throttled_s: float | None = None


Outcome = Succeeded | Awaiting | Drafted | Failed | HandedBack


class Outcomes:
    """Judges what a stage's attempts came to, and writes each outcome and its event in the caller's transaction."""

    def __init__(
        self,
        stage: events.Stage,
        completed_model: type[events.StageCompleted],
        policy: machine.RetryPolicy,
        attempt_timeout_s: float,
        cancel_grace_s: float,
        rng: random.Random,
        metrics: metrics_.StageMetrics,
        registry: events.Registry = events.REGISTRY,
    ) -> None:
        self.stage = stage
        self.completed_model = completed_model
        self.policy = policy
        self.attempt_timeout_s = attempt_timeout_s
        self.cancel_grace_s = cancel_grace_s
        self.rng = rng
        self.metrics = metrics
        self.source = topology.SOURCES[stage.value]
        self.registry = registry
        self.trigger_type = events.TRIGGERS[stage]
        self.reads = registry.current_version(self.trigger_type)  # the trigger's version a completed job is read as

    def judge(
        self, job: repository.Job, result: dict[str, Any], cancel: cancellation.Cancellation, ended: bool
    ) -> Outcome | None:
        """What the attempt came to: its work's `result`, or how it ended (None: nothing to record)."""
        if ended and "output" in result:
            output = result["output"]
            return output if isinstance(output, Awaiting | Drafted) else Succeeded(output)
        if not ended:
            log.error(
                "%s provider still running %g s after its cancellation (%s); its slot stays taken until it returns",
                self.stage.value,
                self.cancel_grace_s,
                cancel.reason,
            )
        error = result.get("error")
        end = failures.end_of(error, cancel, job.polling, self.attempt_timeout_s)
        judged = failures.verdict(end)
        if judged is failures.Verdict.NOTHING:
            log.warning("%s attempt %d stopped: %s", self.stage.value, job.attempts, cancel.reason)
            return None
        if end.kind is failures.Kind.PROVIDER and isinstance(error, errors.ProviderError) and error.detail:
            log.warning("%s attempt %d: %s (%s)", self.stage.value, job.attempts, error.code, error.detail)  # masked
        if end.kind is failures.Kind.CRASH:
            log.error("%s attempt crashed", self.stage.value, exc_info=error)
        return self._judged(job, end, judged)

    def _judged(self, job: repository.Job, end: failures.End, judged: failures.Verdict) -> Failed | HandedBack:
        """The outcome of an attempt that ended as `end`, by its verdict (castad_runtime.stage.failures)."""
        uncounted = job.attempts - 1 - job.counted_attempts  # earlier attempts handed back
        asked = min(end.retry_after_s or 0.0, machine.MAX_RETRY_AFTER_S)
        match judged:
            case failures.Verdict.COUNTED:
                return Failed(end.code, end.message, end.retryable, end.retry_after_s)
            case failures.Verdict.HANDED_BACK:
                return HandedBack(end.code, end.message)
            case failures.Verdict.HANDED_BACK_AFTER_BACKOFF:
                return HandedBack(end.code, end.message, self.policy.delay_s(uncounted + 1, self.rng))
            case failures.Verdict.HANDED_BACK_WHEN_ASKED:
                return HandedBack(end.code, end.message, max(asked, self.policy.delay_s(uncounted + 1, self.rng)))
            case failures.Verdict.HANDED_BACK_WHILE_FREE if uncounted < FREE_RATE_LIMITS:
                delay = max(asked, self.policy.delay_s(uncounted + 1, self.rng))
                return HandedBack(end.code, end.message, min(delay, machine.MAX_RETRY_AFTER_S), throttled_s=asked)
            case failures.Verdict.HANDED_BACK_WHILE_FREE:
                return Failed(end.code, end.message, True, asked)
        raise AssertionError(judged)  # NOTHING is the caller's

    @property
    def passes_remakes(self) -> bool:
        """Whether the stage's `completed` passes a remake on: a stage a remake may reuse (all but the last)."""
        return self.passes_on("remake")

    def passes_on(self, field: str) -> bool:
        """Whether the stage's `completed` passes its trigger's `field` on to the next stage (all but the last)."""
        return field in self.completed_model.model_fields

    def write(self, conn: sa.Connection, job: repository.Job, outcome: Outcome) -> bool:
        """Write `outcome` if `job` is still the current claim; whether it was."""
        if isinstance(outcome, Succeeded):
            return self._write_success(conn, job, outcome.output)
        if isinstance(outcome, Awaiting):
            return self._write_awaiting(conn, job, outcome)
        if isinstance(outcome, Drafted):
            return self._write_drafted(conn, job, outcome)
        if isinstance(outcome, Failed):
            return self._write_failure(conn, job, outcome)
        return self.write_hand_back(conn, job, outcome)

    def _write_awaiting(self, conn: sa.Connection, job: repository.Job, awaiting: Awaiting) -> bool:
        if not attempts.await_provider(conn, job, awaiting.handle, awaiting.poll_in_s, awaiting.notes):
            return False
        if not job.polling:
            done = "waits on an earlier attempt's" if awaiting.handle == job.previous_handle else "submitted as"
            log.info("%s attempt %d: %s %s", self.stage.value, job.attempts, done, awaiting.handle)
        return True

    def _write_drafted(self, conn: sa.Connection, job: repository.Job, drafted: Drafted) -> bool:
        """The job waits for a person's decision on the draft (castad_runtime.stage.reviews), and says so."""
        review = {
            "draft_id": str(uuid.uuid4()),
            "round": job.next_round,
            "artifact": drafted.output.artifact.model_dump(mode="json"),
            "details": _as_json(drafted.output.details),
            "on_timeout": drafted.review.on_timeout,
        }
        if not drafts.draft(conn, job, review, drafted.review.timeout_s):
            return False
        self.emit(
            conn,
            job,
            "drafted",
            events.DRAFTED[self.stage],
            draft_id=review["draft_id"],
            round=review["round"],
            artifact=drafted.output.artifact,
            review_until=attempts.due_at(conn, job.id),
            on_timeout=drafted.review.on_timeout,
            drafted_at=_now(),
            **drafted.output.details,
        )
        log.info("%s attempt %d drafted %s for review", self.stage.value, job.attempts, review["draft_id"])
        return True

    def complete_review(
        self, conn: sa.Connection, job: repository.Job, output: Output, decided: dict[str, Any]
    ) -> None:
        """In the caller's transaction: the job in REVIEW, locked, SUCCEEDED with `output`, as `decided`."""
        result: dict[str, Any] = {"artifact": output.artifact.model_dump(mode="json")}
        if self.passes_remakes:
            result["details"] = _as_json(output.details)
        drafts.end_review(conn, job, {**(job.review or {}), "decided": decided}, result)
        self._emit_completed(conn, job, output)
        db.after_commit(conn, lambda: self.metrics.attempt_ended("succeeded", None, None))

    def _write_success(self, conn: sa.Connection, job: repository.Job, output: Output) -> bool:
        result: dict[str, Any] = {"artifact": output.artifact.model_dump(mode="json")}
        if self.passes_remakes:  # what a remake of the pipeline reuses (castad_runtime.stage.remakes)
            result["details"] = _as_json(output.details)
        if not attempts.finish_attempt(conn, job, machine.Status.SUCCEEDED, "succeeded", result=result):
            return False
        self._emit_completed(conn, job, output)
        log.info("%s succeeded on attempt %d", self.stage.value, job.attempts)
        return True

    def _emit_completed(self, conn: sa.Connection, job: repository.Job, output: Output) -> None:
        trigger = job.trigger(self.registry.model(self.trigger_type, self.reads), self.registry)
        assert isinstance(trigger, events.PipelineRequestedV6 | events.StageCompleted)  # what triggers a stage
        self.emit(
            conn,
            job,
            "completed",
            self.completed_model,
            artifact=output.artifact,
            completed_at=_now(),
            brief=trigger.brief.model_dump(mode="json"),  # as this release's model of it
            max_attempts=trigger.max_attempts,
            **({"remake": remake} if self.passes_remakes and (remake := getattr(trigger, "remake", None)) else {}),
            **({"share": share} if self.passes_on("share") and (share := getattr(trigger, "share", None)) else {}),
            **output.details,
        )

    def _write_failure(self, conn: sa.Connection, job: repository.Job, failure: Failed) -> bool:
        counted = job.counted_attempts + 1
        decision = machine.after_failure(
            self.policy, counted, job.max_attempts, failure.retryable, self.rng, failure.retry_after_s
        )
        message = failure.message[:ERROR_MESSAGE_MAX]
        done = attempts.finish_attempt(
            conn,
            job,
            decision.status,
            "failed_retryable" if failure.retryable else "failed",
            error_code=failure.code,
            error_message=message,
            retry_in_s=decision.delay_s,
        )
        if not done:
            return False
        if decision.status is machine.Status.RETRY_WAIT:
            log.warning(
                "%s attempt %d failed (%s); retry in %.2f s",
                self.stage.value,
                job.attempts,
                failure.code,
                decision.delay_s,
            )
            self._emit_retrying(
                conn, job, failure.code, message, last_attempt=job.attempts - counted + job.max_attempts
            )
        else:
            log.error("%s failed for good on attempt %d: %s", self.stage.value, job.attempts, failure.code)
            self.emit(
                conn,
                job,
                "failed",
                events.StageFailed,
                error_code=failure.code,
                error_message=message,
                failed_at=_now(),
            )
        return True

    def write_hand_back(self, conn: sa.Connection, job: repository.Job, back: HandedBack) -> bool:
        if job.polling:  # the work is still at the provider: only the poll is lost, it is due again
            assert job.handle is not None
            log.warning("%s attempt %d: poll handed back (%s)", self.stage.value, job.attempts, back.code)
            return attempts.await_provider(conn, job, job.handle, back.delay_s)
        done = attempts.finish_attempt(
            conn,
            job,
            machine.Status.RETRY_WAIT,
            "interrupted",
            error_code=back.code,
            error_message=back.message[:ERROR_MESSAGE_MAX],
            retry_in_s=back.delay_s,
            counted=False,
        )
        if not done:
            return False
        if back.throttled_s is not None:  # its request for work was refused, not taken: the provider bills none
            attempts.refused_call(conn, job)
        log.warning("%s attempt %d handed back (%s), not counted", self.stage.value, job.attempts, back.code)
        last_attempt = job.attempts - job.counted_attempts + job.max_attempts
        self._emit_retrying(conn, job, back.code, back.message[:ERROR_MESSAGE_MAX], last_attempt=last_attempt)
        return True

    def _emit_retrying(
        self, conn: sa.Connection, job: repository.Job, code: codes.ErrorCode, message: str, last_attempt: int
    ) -> None:
        self.emit(
            conn,
            job,
            "retrying",
            events.StageRetrying,
            max_attempts=last_attempt,
            error_code=code,
            error_message=message,
            next_attempt_at=attempts.due_at(conn, job.id),
        )

    def emit_canceled(
        self, conn: sa.Connection, request: events.PipelineCancelRequested, job_id: uuid.UUID, attempt: int
    ) -> None:
        """In the caller's transaction: the stage's `canceled` event of the job, whose attempt `attempt` ended."""
        payload = events.StageCanceled(
            pipeline_id=request.pipeline_id,
            stage=self.stage,
            job_id=str(job_id),
            attempt=attempt,
            operation=request.operation,
            reason=request.reason,
            canceled_at=_now(),
            provider_calls=attempts.tell_calls(conn, job_id, attempt) if attempt else None,
        )
        outbox.add(conn, payload, events.stage_event(self.stage, "canceled"), self.source)

    def emit(self, conn: sa.Connection, job: repository.Job, fact: Any, model: type[Any], **fields: Any) -> None:
        """In the caller's transaction: the event of `fact` about `job`'s attempt, in the outbox.

        One that can tells the requests for work the attempt sent its provider since its last event said
        (`started` cannot: none has left yet)."""
        if "provider_calls" in model.model_fields and (calls := attempts.tell_calls(conn, job.id, job.attempts)):
            fields["provider_calls"] = calls
        payload = model(
            pipeline_id=job.pipeline_id, stage=self.stage, job_id=str(job.id), attempt=job.attempts, **fields
        )
        outbox.add(conn, payload, events.stage_event(self.stage, fact), self.source)


def feed_quota(conn: sa.Connection, provider: str, outcome: Outcome) -> None:
    """In the caller's transaction: what a written outcome says of the provider's quota (castad_runtime.stage.quota)."""
    throttled_s = getattr(outcome, "throttled_s", None)
    if throttled_s is not None:
        quota.throttled(conn, provider, throttled_s)
    elif isinstance(outcome, Succeeded | Awaiting | Drafted):
        quota.relieved(conn, provider)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _as_json(details: dict[str, Any]) -> dict[str, Any]:
    """An output's details as a job's row keeps them (its models, and tuples of them, as JSON)."""
    kept: dict[str, Any] = _DETAILS.dump_python(details, mode="json")
    return kept


_DETAILS = pydantic.TypeAdapter(dict[str, Any])
