"""Work a provider does on its own time: submit it, then poll, holding no worker in between.

An attempt's first claim submits the work and gets the provider's handle; the runner commits
it in the job's row (AWAITING) with the first poll due a little later. Each later claim polls
once: unfinished work is due again (the wait grows from `first_s` to `max_s`), finished work
is fetched into the artifact store and the attempt succeeds, failed work fails the attempt
(counted; the next attempt submits anew). A provider's callback only brings the next poll
forward, so the poll alone decides, and callback and poll never complete a job twice. In a
service, the polls that find the work unfinished are made in batches by its prober (`probe`,
castad_runtime.stage.probes), which brings a claim's poll forward as a callback does once the
work is done or failed.

A request that fails on the way (429, 5xx, a timeout, a garbled answer) does not fail work
that is already at the provider: the poll is simply due again, after the provider's
Retry-After if it gave one. Work whose result is not had after `give_up_s` (still unfinished, or its polls or download
failing all along) fails the attempt (`provider_job_timeout`, retryable): a job that never
finishes does not wait for ever; finished work is always fetched first.

A new attempt after one that left work at the provider (its handle is the job's `previous_handle`)
first looks that work up: finished, its result is taken and nothing is paid for again; still at work,
the attempt waits on it (polls it as its own) until the give-up time counted from that work's submit;
failed, lost, or unfinished past that time, new work is submitted. A look-up that fails on the way
fails the attempt as a poll's request would (retryable), rather than paying for work that may exist.

A provider may not know a job for a moment after it took it (an early "not found", as Suno's users report for
fresh tasks): within `NOT_FOUND_GRACE_S` of its submit, "not found" means "ask again later", not "lost".
"""

from __future__ import annotations

import dataclasses
import logging
import mimetypes
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from castad_contracts import codes, events

from castad_runtime import artifacts
from castad_runtime.stage import cancellation, errors, http, machine, outcomes, repository, runner
from castad_runtime.stage.repository import polls

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Pending:
    """The provider's work is not done; `state` is the provider's word for where it is."""

    state: str


@dataclasses.dataclass(frozen=True)
class Finished:
    """The provider's work is done: its result is at `url`; `details` are what else it said of it."""

    url: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Submitted:
    """The provider took the work under `handle`.

    `notes` are its advisory warnings on the request, kept on the attempt (an operator reads them where the attempt
    is).
    """

    handle: str
    notes: tuple[str, ...] = ()


class RemoteApi(Protocol):
    """A submit-then-poll provider (a music or render API)."""

    def submit(self, job: repository.Job, callback_url: str | None, cancel: cancellation.Cancellation) -> Submitted:
        """Hand the job's work to the provider; its handle for it. Raises ProviderError."""
        ...

    def poll(self, handle: str, cancel: cancellation.Cancellation) -> Pending | Finished:
        """Where the work is; raises ProviderError when the request fails or the work failed."""
        ...


@dataclasses.dataclass(frozen=True)
class PollSchedule:
    first_s: float = 5.0
    max_s: float = 30.0
    factor: float = 1.5
    give_up_s: float = 1800.0

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s or self.factor < 1 or self.give_up_s <= 0:
            raise ValueError("need 0 < first_s <= max_s, factor >= 1 and give_up_s > 0")

    def after(self, polls: int) -> float:
        """The wait before the next poll, after `polls` polls found the work unfinished."""
        return min(self.max_s, self.first_s * self.factor ** min(polls, 64))


def keep_result(
    store: artifacts.ArtifactStore,
    job: repository.Job,
    stage: events.Stage,
    finished: Finished,
    cancel: cancellation.Cancellation,
    *,
    media_types: tuple[str, ...],
    max_bytes: int,
    timeout_s: float,
    allow_private: bool = False,
) -> events.Artifact:
    """Download the provider's result into the artifact store (size-capped, its type checked, hashed)."""
    # Named by the claim (its version), not the attempt: two claims of one attempt never share a file.
    with store.scratch(job.pipeline_id, stage, job.version, ".download") as scratch:
        got = http.download(
            finished.url,
            scratch,
            cancel,
            media_types=media_types,
            max_bytes=max_bytes,
            timeout_s=timeout_s,
            allow_private=allow_private,
        )
        named = scratch.rename(scratch.with_suffix(_extension(got.media_type)))
        return store.keep(named, job.pipeline_id, stage, got.media_type)


def _extension(media_type: str) -> str:
    return {"audio/wav": ".wav", "audio/mp3": ".mp3"}.get(media_type) or mimetypes.guess_extension(media_type) or ".bin"


# While work is at the provider, these only mean "ask again later" (bounded by give_up_s): a failed
# request, and a key refused or unreadable for a moment (a rotation), which must not lose the work.
WAIT_ON = errors.CALL_FAILURES | {codes.ErrorCode.PROVIDER_AUTH, codes.ErrorCode.PROVIDER_KEY_UNREADABLE}

# How long after its submit a provider's "not found" for the work is taken as "not listed yet" (ask again later).
NOT_FOUND_GRACE_S = 120.0

# What a look-up of an earlier attempt's work may find that lets new work be submitted: nothing to take there.
GONE = frozenset(
    {
        codes.ErrorCode.PROVIDER_JOB_FAILED,
        codes.ErrorCode.PROVIDER_JOB_LOST,
        codes.ErrorCode.PROVIDER_JOB_CANCELED,
        codes.ErrorCode.CONTENT_REFUSED,
    }
)


@dataclasses.dataclass(frozen=True)
class Later:
    """Not had yet: ask again in `wait_s`; `throttled_s`: the provider said "too many" (its Retry-After, or 0).

    `asked`: the provider answered (False: the poll never went, as when the service stops first).
    """

    wait_s: float
    throttled_s: float | None = None
    asked: bool = True


def _later(error: errors.ProviderError, schedule: PollSchedule, polls: int, waited_s: float) -> Later | None:
    """A poll's request failed on the way: when to ask again; None if the failure is the work's own."""
    if _not_listed_yet(error, waited_s):
        return Later(schedule.after(polls))
    if error.code not in WAIT_ON or (error.code in errors.CALL_FAILURES and not error.retryable):
        return None
    asked = min(error.retry_after_s or 0.0, machine.MAX_RETRY_AFTER_S)
    throttled_s = asked if error.code == codes.ErrorCode.PROVIDER_RATE_LIMITED else None
    return Later(max(asked, schedule.after(polls)), throttled_s)


def _not_listed_yet(error: errors.ProviderError, waited_s: float | None) -> bool:
    """The provider said it does not know work submitted so lately that it may only not list it yet."""
    return error.code == codes.ErrorCode.PROVIDER_JOB_LOST and waited_s is not None and waited_s < NOT_FOUND_GRACE_S


Fetch = Callable[[repository.Job, Finished, cancellation.Cancellation], outcomes.Output]
CallbackUrl = Callable[[repository.Job], str | None]
Probe = Callable[[polls.Probe, cancellation.Cancellation], Later | None]


@dataclasses.dataclass(frozen=True)
class RemoteWork:
    """A stage's work at a submit-then-poll provider (`run`), its polls in batches (`probe`), its readiness checks.

    `readiness`: what the stage's readiness checks of the provider, a check's name -> the check."""

    run: runner.Work
    probe: Probe
    readiness: Mapping[str, Callable[[], str]] = dataclasses.field(default_factory=dict)

    def __call__(
        self, job: repository.Job, cancel: cancellation.Cancellation
    ) -> outcomes.Output | outcomes.Awaiting | outcomes.Drafted:
        return self.run(job, cancel)


def work(api: RemoteApi, schedule: PollSchedule, callback_url: CallbackUrl, fetch: Fetch) -> RemoteWork:
    """The stage's work for a submit-then-poll provider: `fetch` turns its finished work into the output."""

    def run(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output | outcomes.Awaiting:
        if job.handle is None:
            if job.previous_handle is not None:
                earlier = look_up(job.previous_handle, job.previous_waited_s, cancel)
                if isinstance(earlier, Finished):
                    log.info("the work %s an earlier attempt left is done: taken, not paid again", job.previous_handle)
                    return fetch(job, earlier, cancel)
                if earlier is not None:
                    log.info("the work %s an earlier attempt left is still at work: waited on", job.previous_handle)
                    return outcomes.Awaiting(job.previous_handle, earlier.wait_s)
            submitted = api.submit(job, callback_url(job), cancel)
            return outcomes.Awaiting(submitted.handle, schedule.first_s, notes=submitted.notes)
        try:
            state = api.poll(job.handle, cancel)
            if isinstance(state, Finished):
                return fetch(job, state, cancel)
            give_up(job)
            return outcomes.Awaiting(job.handle, schedule.after(job.polls))
        except errors.ProviderError as error:
            if (later := _later(error, schedule, job.polls, job.waited_s)) is None:
                raise
            give_up(job)
            _asking_later(job.handle, error)
            return outcomes.Awaiting(job.handle, later.wait_s, later.throttled_s)

    def look_up(handle: str, waited_s: float | None, cancel: cancellation.Cancellation) -> Finished | Later | None:
        """The earlier attempt's work: finished, still at work within its give-up time (when to poll it), or None.

        None: it failed, is lost, or is unfinished past the give-up time counted from its submit (`waited_s`; None
        when not known, as for a job an earlier release failed: the give-up time then counts from this claim).
        """
        try:
            state = api.poll(handle, cancel)
        except errors.ProviderError as error:
            if _not_listed_yet(error, waited_s):
                return Later(schedule.first_s)
            if error.code in GONE:
                log.info("the work %s an earlier attempt left is gone (%s): submitting anew", handle, error.code)
                return None
            raise
        if isinstance(state, Finished):
            return state
        if waited_s is not None and waited_s > schedule.give_up_s:
            log.info("the work %s an earlier attempt left was not had within its give-up time: submitting anew", handle)
            return None
        return Later(schedule.first_s)

    def give_up(job: repository.Job) -> None:
        """Work still not had after give_up_s (by the database's clock) fails the attempt."""
        if job.waited_s > schedule.give_up_s:
            raise errors.ProviderError(
                codes.ErrorCode.PROVIDER_JOB_TIMEOUT,
                f"the provider's work {job.handle} was not had after {schedule.give_up_s:g} s",
            )

    return RemoteWork(run, probe(api, schedule))


def _asking_later(handle: str, error: errors.ProviderError) -> None:
    detail = f": {error.detail}" if error.detail else ""
    log.warning("polling %s failed on the way (%s%s); asking again later", handle, error.code, detail)


def probe(api: RemoteApi, schedule: PollSchedule) -> Probe:
    """One poll of a batch (castad_runtime.stage.probes): when to ask again, or None when a claim must take the job.

    None when the work is done or failed, or waited past `give_up_s`: the claim then polls once more and does what
    `work` does (fetch the result, fail the attempt). A request that fails on the way is asked again later, as in
    `work`.
    """

    def ask(job: polls.Probe, cancel: cancellation.Cancellation) -> Later | None:
        if job.waited_s > schedule.give_up_s:
            return None
        try:
            state = api.poll(job.handle, cancel)
        except errors.ProviderError as error:
            if (later := _later(error, schedule, job.polls, job.waited_s)) is not None:
                _asking_later(job.handle, error)
            return later
        return None if isinstance(state, Finished) else Later(schedule.after(job.polls))

    return ask
