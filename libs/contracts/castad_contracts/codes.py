"""Every error code a pipeline's events and the API may carry, with its one-line meaning.

A code is a stable word: a stage's failed and retrying events carry it (`error_code`), the gateway
records it and shows it to a tenant with its meaning, never the stage's own message. Values never
change (they are on the wire and in every database); a new kind of failure is a new member. A code
this version does not know (a newer producer's) still reads: the events' fields are plain strings.
"""

from __future__ import annotations

import enum
from typing import Self


class ErrorCode(enum.StrEnum):
    """An error code and `meaning`, what a tenant is told it means."""

    meaning: str

    def __new__(cls, value: str, meaning: str) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member

    @classmethod
    def known(cls, code: str) -> ErrorCode | None:
        """Return the member whose value is `code`, or None for a code this version does not know."""
        return next((member for member in cls if member.value == code), None)

    # The gateway's own.
    CANCELED = "canceled", "the pipeline was canceled (see its cancel_reason)"
    DEADLINE_EXCEEDED = "deadline_exceeded", "the pipeline did not end before its deadline and was canceled"
    REVIEW_TIMEOUT = "review_timeout", "no one decided on the draft in time, and the review said to cancel then"
    REMAKE_SOURCE_GONE = "remake_source_gone", "the pipeline a remake reuses no longer has this stage's output"
    # The stage machine's (castad_runtime.stage.runner): the machinery, tried again, never counted but the first.
    ATTEMPT_TIMEOUT = "attempt_timeout", "the attempt took longer than a stage allows"
    INTERNAL_ERROR = "internal_error", "the stage failed for a reason of its own; it is tried again"
    WORKER_STOPPED = "worker_stopped", "the worker running the attempt stopped; it is tried again"
    LEASE_EXPIRED = "lease_expired", "the worker running the attempt was lost; it is tried again"
    LEASE_LOST = "lease_lost", "the work was held back as its worker no longer held the job; it is tried again"
    OUTAGE = "outage", "a part of the platform was unavailable; it is tried again"
    POLL_TIMEOUT = "poll_timeout", "the provider did not answer about the work in time"
    PROVIDER_JOB_TIMEOUT = "provider_job_timeout", "the provider's work did not end in the time a stage gives it"
    # A provider's answers.
    PROVIDER_RATE_LIMITED = "provider_rate_limited", "the provider asked for fewer requests; it is tried again later"
    PROVIDER_MAINTENANCE = "provider_maintenance", "the provider is down for maintenance; it is tried again later"
    PROVIDER_UNAVAILABLE = "provider_unavailable", "the provider is unavailable"
    PROVIDER_TIMEOUT = "provider_timeout", "the provider did not answer in time"
    PROVIDER_UNREACHABLE = "provider_unreachable", "the provider could not be reached"
    PROVIDER_MALFORMED = "provider_malformed", "the provider's answer could not be read"
    PROVIDER_TRUNCATED = "provider_truncated", "the provider's result was cut short"
    PROVIDER_REJECTED = "provider_rejected", "the provider refused the request"
    PROVIDER_AUTH = "provider_auth", "the platform's access to the provider was refused"
    PROVIDER_URL_REFUSED = (
        "provider_url_refused",
        "the provider, or where it put the result, is at an address not allowed",
    )
    PROVIDER_KEY_UNREADABLE = "provider_key_unreadable", "the platform's access to the provider is not set up"
    PROVIDER_CREDITS_EXHAUSTED = "provider_credits_exhausted", "the platform's credit at the provider is used up"
    PROVIDER_JOB_FAILED = "provider_job_failed", "the provider failed the work"
    PROVIDER_JOB_LOST = "provider_job_lost", "the provider lost the work"
    PROVIDER_JOB_CANCELED = "provider_job_canceled", "the work was canceled at the provider"
    PROVIDER_ARTIFACT_INVALID = "provider_artifact_invalid", "the provider's result is not a valid file"
    CONTENT_REFUSED = "content_refused", "the provider refused the content of the brief"
    CONTENT_FILTERED = "content_filtered", "the provider's content filter stopped the result"
    # The video stage's.
    SONG_MISSING = "song_missing", "the song to put in the video was not found"
    SONG_UNREACHABLE = "song_unreachable", "the song to put in the video could not be fetched"
    SONG_UNREADABLE = "song_unreadable", "the song to put in the video could not be read"
    PHOTO_UNREACHABLE = "photo_unreachable", "a photo to put in the video could not be fetched"
    PHOTO_UNREADABLE = "photo_unreadable", "a photo to put in the video could not be read"
    PHOTO_REFUSED = "photo_refused", "a photo's URL is not allowed: an https URL of a public address is needed"
    PHOTO_TOO_LARGE = "photo_too_large", "a photo to put in the video is larger than accepted, in bytes or in pixels"
    PHOTO_TIMEOUT = "photo_timeout", "a photo to put in the video did not arrive in time"
    PHOTO_NOT_SEALED = "photo_not_sealed", "an uploaded photo the brief names was not named by the gateway for it"
    RENDER_FAILED = "render_failed", "the video could not be rendered"
    RENDER_INTERRUPTED = "render_interrupted", "the video's rendering was interrupted; it is tried again"
    TEMPLATE_MISMATCH = "template_mismatch", "the video template does not take what the stage sends it"
    FORMAT_UNSUPPORTED = "format_unsupported", "the video's renderer cannot make a format the brief asks for"
    # Tests and demonstrations (CASTAD_<STAGE>_FAULT_*).
    INJECTED_FAULT = "injected_fault", "a fault injected on purpose"


# Codes of attempts the stage runner hands back as the machinery failed, not the work: shown as interrupted,
# never counted. A provider's "too many" is handed back too for its first tries, but its event does not say
# whether it was counted: it shows as a retryable failure with code provider_rate_limited.
INTERRUPTIONS = (ErrorCode.WORKER_STOPPED, ErrorCode.LEASE_EXPIRED, ErrorCode.OUTAGE)
