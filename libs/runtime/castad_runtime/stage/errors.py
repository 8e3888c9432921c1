"""Errors a provider raises; the stage machine decides retry or failure from them."""

from __future__ import annotations


class ProviderError(Exception):
    """A provider call failed. `retryable` says whether another attempt may succeed; `retry_after_s`
    is how long the provider asked us to wait before the next one (its `Retry-After`), if it said."""

    retryable: bool = True

    def __init__(
        self, code: str, message: str, *, retryable: bool | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        if retryable is not None:
            self.retryable = retryable


class RetryableProviderError(ProviderError):
    retryable = True


class PermanentProviderError(ProviderError):
    retryable = False
