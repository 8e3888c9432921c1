"""How an attempt that brought no result is judged: counted against its attempts, handed back, or let go.

Where an attempt fails, in the order a failure travels:

1. The provider's adapter turns what the provider said into an `errors.ProviderError` with an `ErrorCode`, and
   says whether trying again may help (`retryable`) and when (`retry_after_s`): castad_song.suno.code_error,
   castad_video.creatomate, castad_lyric.chat, and castad_runtime.stage.http for what every network provider
   shares (a refused connection, a timeout, a 5xx).
2. While the work is at a provider, castad_runtime.stage.remote asks again later after a poll that failed on the
   way (no attempt spent), and fails work not had after its give-up time as `provider_job_timeout`.
3. This module: `end_of` names what ended the attempt (its `Kind` and code), and `TABLE` decides its `Verdict`.
   The runner (castad_runtime.stage.runner) applies the verdict: a counted failure, or an attempt handed back.
4. castad_runtime.stage.machine.after_failure: a counted failure is retried after a backoff while the job has
   attempts left and the error is retryable, or the job is FAILED.

A new error code: add it to castad_contracts.codes.ErrorCode (with its meaning, which the API documents), raise it
from the adapter, and, if it is not the work's failure (the provider down for maintenance, say), a row here.
"""

from __future__ import annotations

import dataclasses
import enum

from castad_contracts import codes

from castad_runtime import outages, redact
from castad_runtime.stage import cancellation, errors, fence


class Kind(enum.StrEnum):
    """What ended an attempt that brought no result."""

    POLL_TIMED_OUT = "a poll took longer than the attempt's timeout (the work at the provider goes on)"
    TIMED_OUT = "the attempt took longer than its timeout (its work is cancelled)"
    STOPPED = "the service stopped before the attempt finished (after its grace period)"
    LET_GO = "the job moved on: canceled, or claimed again by another worker"
    FENCED = "the work was about to leave while the lease was not known to be held, or the database was out"
    PROVIDER = "the provider, or the way to it, said no (errors.ProviderError)"
    SHORTAGE = "the machine ran short of disk or memory, or the artifact store was out"
    CRASH = "the stage's own error"


class Verdict(enum.Enum):
    """What an ended attempt costs the job."""

    COUNTED = "a failure counted against the job's attempts, retried as machine.after_failure says"
    HANDED_BACK = "not counted: the job is due again at once"
    HANDED_BACK_AFTER_BACKOFF = "not counted: due again after the retry policy's backoff"
    HANDED_BACK_WHEN_ASKED = "not counted: due again when the provider asked (at most MAX_RETRY_AFTER_S), or later"
    HANDED_BACK_WHILE_FREE = "not counted for the job's first FREE_RATE_LIMITS, then counted"
    NOTHING = "nothing recorded: whoever holds the job now records what becomes of it"


@dataclasses.dataclass(frozen=True)
class End:
    """What ended an attempt: its kind, its error code and message, and what the provider said of trying again."""

    kind: Kind
    code: codes.ErrorCode
    message: str
    retryable: bool = True
    retry_after_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Row:
    kind: Kind
    code: codes.ErrorCode | None  # None: any code
    retryable: bool | None  # None: either
    verdict: Verdict


E = codes.ErrorCode
# Read top to bottom: the first row that matches an End decides.
TABLE = (
    Row(Kind.POLL_TIMED_OUT, None, None, Verdict.HANDED_BACK),
    Row(Kind.TIMED_OUT, None, None, Verdict.COUNTED),
    Row(Kind.STOPPED, None, None, Verdict.HANDED_BACK),
    Row(Kind.LET_GO, None, None, Verdict.NOTHING),
    Row(Kind.FENCED, E.OUTAGE, None, Verdict.HANDED_BACK_AFTER_BACKOFF),
    Row(Kind.FENCED, None, None, Verdict.HANDED_BACK),  # lease_lost: its work did not leave
    # Down for maintenance: like an outage, it costs no attempt however long it lasts.
    Row(Kind.PROVIDER, E.PROVIDER_MAINTENANCE, True, Verdict.HANDED_BACK_WHEN_ASKED),
    # Waiting for the provider is not the work failing, unless it never stops saying "too many".
    Row(Kind.PROVIDER, E.PROVIDER_RATE_LIMITED, True, Verdict.HANDED_BACK_WHILE_FREE),
    Row(Kind.PROVIDER, None, None, Verdict.COUNTED),
    Row(Kind.SHORTAGE, None, None, Verdict.HANDED_BACK_AFTER_BACKOFF),
    Row(Kind.CRASH, None, None, Verdict.COUNTED),
)


def verdict(end: End) -> Verdict:
    """The verdict of the first row of TABLE that matches `end`."""
    for row in TABLE:
        if row.kind is end.kind and row.code in (None, end.code) and row.retryable in (None, end.retryable):
            return row.verdict
    raise LookupError(f"no row of failures.TABLE for {end}")  # every kind has a row for any code


def end_of(error: BaseException | None, cancel: cancellation.Cancellation, polling: bool, timeout_s: float) -> End:
    """What ended an attempt whose work raised `error` (None: it was cancelled and did not return).

    A cancellation explains whatever the cancelled work raised (a killed child, say).
    """
    if cancel.reason is cancellation.Reason.TIMEOUT and polling:
        return End(Kind.POLL_TIMED_OUT, E.POLL_TIMEOUT, f"a poll took more than {timeout_s:g} s")
    if cancel.reason is cancellation.Reason.TIMEOUT:
        return End(Kind.TIMED_OUT, E.ATTEMPT_TIMEOUT, f"no result within {timeout_s:g} s")
    if cancel.reason is cancellation.Reason.SHUTDOWN:
        return End(Kind.STOPPED, E.WORKER_STOPPED, "the service stopped before the attempt finished")
    if cancel.reason in (cancellation.Reason.SUPERSEDED, cancellation.Reason.CANCELED):
        return End(Kind.LET_GO, E.CANCELED, str(cancel.reason))
    if isinstance(error, fence.Fenced):
        return End(Kind.FENCED, error.code, error.message)
    if isinstance(error, errors.ProviderError):
        return End(Kind.PROVIDER, error.code, error.message, error.retryable, error.retry_after_s)
    if error is not None and outages.is_resource_shortage(error):
        return End(Kind.SHORTAGE, E.OUTAGE, redact.describe(error))
    return End(Kind.CRASH, E.INTERNAL_ERROR, "the stage failed on an error of its own (its logs say which)")
