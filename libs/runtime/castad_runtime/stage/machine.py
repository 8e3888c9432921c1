"""The stage state machine and retry policy: pure logic, no I/O.

PENDING --claim--> RUNNING --ok--> SUCCEEDED
   ^                  |
   +-- due -- RETRY_WAIT <--retryable--+
                      +--non-retryable or attempts exhausted--> FAILED
(any non-terminal) --cancel--> CANCELED
FAILED, CANCELED --operator retry--> PENDING (or WAITING when its trigger has not come yet)
WAITING --its trigger comes--> PENDING
RUNNING --submitted to a provider, or its job there still runs--> AWAITING --due: poll--> RUNNING
RUNNING --drafted, for a person to decide on--> REVIEW --approved, edited or timed out--> SUCCEEDED
REVIEW --regenerate--> PENDING (a new draft, on a new attempt that no failure counted)

AWAITING holds no worker: the provider's handle is in the row and a poll is due at `due_at`
(sooner when the provider calls back). The attempt that submitted the work goes on through
its polls; it ends when a poll finds the provider's job done or failed.

REVIEW holds no worker either: the draft is in the row (`review`), and `due_at` is when its review times out
(castad_runtime.stage.reviews). It is neither claimable nor at a provider (no quota's in-flight count).

A job canceled before its trigger came is a CANCELED row without input: the trigger, when it
comes, is kept in it but starts nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import random

from castad_contracts import api

from castad_runtime import backoff


class Status(enum.StrEnum):
    WAITING = "WAITING"  # reopened by a retry before its trigger came
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RETRY_WAIT = "RETRY_WAIT"
    AWAITING = "AWAITING"  # submitted to a provider: a poll is due at due_at
    REVIEW = "REVIEW"  # a draft waits for a person's decision until due_at
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(status for status in Status if status.value in api.ENDED)  # a job ends as a pipeline does
CLAIMABLE = frozenset({Status.PENDING, Status.RETRY_WAIT, Status.AWAITING})
NEW_ATTEMPT = frozenset({Status.PENDING, Status.RETRY_WAIT})  # a claim of these starts an attempt

TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.WAITING: frozenset({Status.PENDING, Status.CANCELED}),
    Status.PENDING: frozenset({Status.RUNNING, Status.CANCELED}),
    Status.RUNNING: frozenset(
        {Status.SUCCEEDED, Status.RETRY_WAIT, Status.AWAITING, Status.REVIEW, Status.FAILED, Status.CANCELED}
    ),
    Status.RETRY_WAIT: frozenset({Status.RUNNING, Status.CANCELED}),
    Status.AWAITING: frozenset({Status.RUNNING, Status.CANCELED}),
    Status.REVIEW: frozenset({Status.SUCCEEDED, Status.PENDING, Status.CANCELED}),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset({Status.PENDING}),
    Status.CANCELED: frozenset({Status.PENDING, Status.WAITING}),
}


class IllegalTransition(ValueError):
    pass


def check_transition(current: Status, target: Status) -> None:
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(f"{current} -> {target} is not a stage transition")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, up to max_attempts attempts in all."""

    max_attempts: int = 5
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be within [0, 1]")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("need 0 <= base_delay_s <= max_delay_s")

    def delay_s(self, failed_attempt: int, rng: random.Random) -> float:
        """Delay after the given failed attempt (1-based): base * 2^(n-1), capped, minus jitter."""
        return backoff.exponential_s(failed_attempt - 1, self.base_delay_s, self.max_delay_s, self.jitter, rng)


@dataclasses.dataclass(frozen=True)
class Decision:
    status: Status
    delay_s: float = 0.0


# The longest wait a provider's Retry-After can impose on a job (a larger one is taken as this).
MAX_RETRY_AFTER_S = 3600.0


def after_failure(
    policy: RetryPolicy,
    attempt: int,
    max_attempts: int,
    retryable: bool,
    rng: random.Random,
    retry_after_s: float | None = None,
) -> Decision:
    """What a failed attempt leads to: another try later (never sooner than the provider asked), or the end."""
    if retryable and attempt < max_attempts:
        asked = min(max(retry_after_s or 0.0, 0.0), MAX_RETRY_AFTER_S)
        return Decision(Status.RETRY_WAIT, max(policy.delay_s(attempt, rng), asked))
    return Decision(Status.FAILED)
