"""Errors a provider raises; the stage machine decides retry or failure from them."""

from __future__ import annotations

from castad_contracts import codes


class ProviderError(Exception):
    """A provider call failed.

    `retryable` says whether another attempt may succeed; `retry_after_s` is how long the provider asked us to wait
    before the next one (its `Retry-After`), if it said; `status` is the HTTP status it answered with, if it was an
    error answer.

    `code` and `message` are public: they reach the tenant (the job's last error, its events).
    What the provider or a host said in its own words goes in `detail`, which only the logs get
    (masked): an answer's body is never the tenant's to read."""

    retryable: bool = True

    def __init__(
        self,
        code: codes.ErrorCode,
        message: str,
        *,
        retryable: bool | None = None,
        retry_after_s: float | None = None,
        status: int | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = detail
        self.retry_after_s = retry_after_s
        self.status = status
        if retryable is not None:
            self.retryable = retryable


# A request to the provider failed, not the work it was asked to do: while a job waits on a provider
# (it holds a handle), such a failure only means "ask again later" (see castad_runtime.stage.remote).
CALL_FAILURES = frozenset(
    {
        codes.ErrorCode.PROVIDER_RATE_LIMITED,
        codes.ErrorCode.PROVIDER_MAINTENANCE,
        codes.ErrorCode.PROVIDER_UNAVAILABLE,
        codes.ErrorCode.PROVIDER_TIMEOUT,
        codes.ErrorCode.PROVIDER_UNREACHABLE,
        codes.ErrorCode.PROVIDER_MALFORMED,
    }
)


class RetryableProviderError(ProviderError):
    retryable = True


class PermanentProviderError(ProviderError):
    retryable = False
