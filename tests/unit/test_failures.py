"""How an attempt that brought no result is judged (castad_runtime.stage.failures), and its page."""

from __future__ import annotations

import errno

import pytest
from castad_contracts import codes
from castad_local import REPO_ROOT
from castad_runtime.stage import cancellation, errors, failures, fence

E = codes.ErrorCode
V = failures.Verdict


def cancelled(reason: cancellation.Reason | None) -> cancellation.Cancellation:
    cancel = cancellation.Cancellation()
    if reason is not None:
        cancel.cancel(reason)
    return cancel


def test_every_kind_of_end_has_a_verdict_whatever_its_code():
    for kind in failures.Kind:
        for code in codes.ErrorCode:
            for retryable in (True, False):
                assert failures.verdict(failures.End(kind, code, "", retryable)) in failures.Verdict


@pytest.mark.parametrize(
    ("error", "reason", "polling", "kind", "code", "verdict"),
    [
        # A cancellation explains whatever the cancelled work raised.
        (ValueError("killed"), cancellation.Reason.TIMEOUT, True, "POLL_TIMED_OUT", E.POLL_TIMEOUT, V.HANDED_BACK),
        (ValueError("killed"), cancellation.Reason.TIMEOUT, False, "TIMED_OUT", E.ATTEMPT_TIMEOUT, V.COUNTED),
        (
            errors.ProviderError(E.PROVIDER_REJECTED, "no", retryable=False),
            cancellation.Reason.SHUTDOWN,
            False,
            "STOPPED",
            E.WORKER_STOPPED,
            V.HANDED_BACK,
        ),
        (None, cancellation.Reason.CANCELED, False, "LET_GO", E.CANCELED, V.NOTHING),
        (None, cancellation.Reason.SUPERSEDED, True, "LET_GO", E.CANCELED, V.NOTHING),
        (fence.Fenced(E.OUTAGE, "the database is out"), None, False, "FENCED", E.OUTAGE, V.HANDED_BACK_AFTER_BACKOFF),
        (fence.Fenced(E.LEASE_LOST, "not known to be held"), None, False, "FENCED", E.LEASE_LOST, V.HANDED_BACK),
        (
            errors.ProviderError(E.PROVIDER_MAINTENANCE, "down", retry_after_s=60),
            None,
            False,
            "PROVIDER",
            E.PROVIDER_MAINTENANCE,
            V.HANDED_BACK_WHEN_ASKED,
        ),
        (
            errors.ProviderError(E.PROVIDER_MAINTENANCE, "down for good", retryable=False),
            None,
            False,
            "PROVIDER",
            E.PROVIDER_MAINTENANCE,
            V.COUNTED,
        ),
        (
            errors.ProviderError(E.PROVIDER_RATE_LIMITED, "too many"),
            None,
            False,
            "PROVIDER",
            E.PROVIDER_RATE_LIMITED,
            V.HANDED_BACK_WHILE_FREE,
        ),
        (
            errors.ProviderError(E.PROVIDER_UNAVAILABLE, "502"),
            None,
            False,
            "PROVIDER",
            E.PROVIDER_UNAVAILABLE,
            V.COUNTED,
        ),
        (
            OSError(errno.ENOSPC, "No space left on device"),
            None,
            False,
            "SHORTAGE",
            E.OUTAGE,
            V.HANDED_BACK_AFTER_BACKOFF,
        ),
        (OSError(errno.ECONNRESET, "reset"), None, False, "CRASH", E.INTERNAL_ERROR, V.COUNTED),
        (KeyError("x"), None, True, "CRASH", E.INTERNAL_ERROR, V.COUNTED),
    ],
)
def test_an_end_is_named_by_what_ended_it_the_cancellation_first_and_judged_by_the_table(
    error, reason, polling, kind, code, verdict
):
    end = failures.end_of(error, cancelled(reason), polling, 30.0)
    assert (end.kind, end.code, failures.verdict(end)) == (failures.Kind[kind], code, verdict)


def test_the_stage_machine_page_shows_the_table_as_it_is():
    page = (REPO_ROOT / "docs" / "concepts" / "stage-machine.md").read_text()
    either = {None: "either", True: "yes", False: "no"}
    for row in failures.TABLE:
        code = f"`{row.code.value}`" if row.code else "any"
        line = f"| `{row.kind.name}`: {row.kind.value} | {code} | {either[row.retryable]} |"
        assert f"{line} `{row.verdict.name}`: {row.verdict.value} |" in page, row
