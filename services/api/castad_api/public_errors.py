"""What a tenant is told of an error: its code, and the code's public message from this one table.

An attempt's own message is written for operators: it may name a file, a host, a provider's answer or
an exception. A tenant's key is shown the code (a stable word, documented here) and this message instead;
an admin key sees the message as the stage wrote it (disclosure.py).
"""

from __future__ import annotations

MESSAGES: dict[str, str] = {
    # The gateway's own.
    "canceled": "the pipeline was canceled (see its cancel_reason)",
    "deadline_exceeded": "the pipeline did not end before its deadline and was canceled",
    # The stage machine's (castad_runtime.stage.runner): the machinery, tried again, never counted but the first.
    "attempt_timeout": "the attempt took longer than a stage allows",
    "internal_error": "the stage failed for a reason of its own; it is tried again",
    "worker_stopped": "the worker running the attempt stopped; it is tried again",
    "lease_expired": "the worker running the attempt was lost; it is tried again",
    "outage": "a part of the platform was unavailable; it is tried again",
    "poll_timeout": "the provider did not answer about the work in time",
    # A provider's answers.
    "provider_rate_limited": "the provider asked for fewer requests; it is tried again later",
    "provider_unavailable": "the provider is unavailable",
    "provider_timeout": "the provider did not answer in time",
    "provider_unreachable": "the provider could not be reached",
    "provider_malformed": "the provider's answer could not be read",
    "provider_truncated": "the provider's result was cut short",
    "provider_rejected": "the provider refused the request",
    "provider_auth": "the platform's access to the provider was refused",
    "provider_key_unreadable": "the platform's access to the provider is not set up",
    "provider_credits_exhausted": "the platform's credit at the provider is used up",
    "provider_job_failed": "the provider failed the work",
    "provider_job_lost": "the provider lost the work",
    "provider_artifact_invalid": "the provider's result is not a valid file",
    "content_refused": "the provider refused the content of the brief",
    # The video stage's.
    "song_missing": "the song to put in the video was not found",
    "song_unreachable": "the song to put in the video could not be fetched",
    "photo_unreachable": "a photo to put in the video could not be fetched",
    "photo_unreadable": "a photo to put in the video could not be read",
    "photo_refused": "a photo's URL is not allowed: an https URL of a public address is needed",
    "photo_too_large": "a photo to put in the video is larger than accepted, in bytes or in pixels",
    "photo_timeout": "a photo to put in the video did not arrive in time",
    "song_unreadable": "the song to put in the video could not be read",
    "render_failed": "the video could not be rendered",
    "render_interrupted": "the video's rendering was interrupted; it is tried again",
    # Tests and demonstrations (CASTAD_<STAGE>_FAULT_*).
    "injected_fault": "a fault injected on purpose",
}
UNKNOWN = "the stage failed"


def message(code: str | None) -> str | None:
    """The public message of an error code (None without one)."""
    if code is None:
        return None
    return MESSAGES.get(code, UNKNOWN)
