"""The stage state machine and its retry policy: pure rules, no I/O."""

from __future__ import annotations

import itertools
import random

import pytest
from castad_runtime.stage import machine
from castad_runtime.stage.machine import Status

LEGAL = {
    (Status.PENDING, Status.RUNNING),
    (Status.PENDING, Status.CANCELED),
    (Status.RUNNING, Status.SUCCEEDED),
    (Status.RUNNING, Status.RETRY_WAIT),
    (Status.RUNNING, Status.FAILED),
    (Status.RUNNING, Status.CANCELED),
    (Status.RETRY_WAIT, Status.RUNNING),
    (Status.RETRY_WAIT, Status.CANCELED),
    # Work submitted to a provider: waiting for it holds no worker, each poll is a claim.
    (Status.RUNNING, Status.AWAITING),
    (Status.AWAITING, Status.RUNNING),
    (Status.AWAITING, Status.CANCELED),
    # A draft for a person to decide on: waiting holds no worker; approved, edited or timed out it is done.
    (Status.RUNNING, Status.REVIEW),
    (Status.REVIEW, Status.SUCCEEDED),
    (Status.REVIEW, Status.PENDING),
    (Status.REVIEW, Status.CANCELED),
    # An operator's retry, and the trigger of a job a retry reopened before it came.
    (Status.FAILED, Status.PENDING),
    (Status.CANCELED, Status.PENDING),
    (Status.CANCELED, Status.WAITING),
    (Status.WAITING, Status.PENDING),
    (Status.WAITING, Status.CANCELED),
}


@pytest.mark.parametrize(("current", "target"), list(itertools.product(Status, Status)))
def test_only_the_documented_transitions_are_allowed(current, target):
    if (current, target) in LEGAL:
        machine.check_transition(current, target)
    else:
        with pytest.raises(machine.IllegalTransition, match=f"{current} -> {target}"):
            machine.check_transition(current, target)


def test_terminal_states_are_exactly_succeeded_failed_canceled_and_only_a_retry_leaves_them():
    assert {status for status in Status if status.terminal} == {Status.SUCCEEDED, Status.FAILED, Status.CANCELED}
    assert all(machine.TRANSITIONS[status] <= {Status.PENDING, Status.WAITING} for status in Status if status.terminal)
    assert not machine.TRANSITIONS[Status.SUCCEEDED]


def test_backoff_doubles_and_is_capped_without_jitter():
    policy = machine.RetryPolicy(max_attempts=10, base_delay_s=1.0, max_delay_s=10.0, jitter=0.0)
    rng = random.Random(1)
    assert [policy.delay_s(n, rng) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_jitter_takes_off_at_most_its_fraction_and_varies():
    policy = machine.RetryPolicy(max_attempts=10, base_delay_s=4.0, max_delay_s=60.0, jitter=0.5)
    rng = random.Random(7)
    delays = [policy.delay_s(1, rng) for _ in range(500)]
    assert all(2.0 <= delay <= 4.0 for delay in delays)
    assert max(delays) - min(delays) > 1.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"jitter": 1.5},
        {"jitter": -0.1},
        {"base_delay_s": -1.0},
        {"base_delay_s": 10.0, "max_delay_s": 5.0},
    ],
)
def test_a_nonsensical_policy_is_refused(kwargs):
    with pytest.raises(ValueError):
        machine.RetryPolicy(**kwargs)


def test_a_retry_waits_at_least_as_long_as_the_provider_asked_within_a_cap():
    policy = machine.RetryPolicy(max_attempts=5, base_delay_s=1.0, max_delay_s=8.0, jitter=0.0)
    rng = random.Random(0)
    asked = machine.after_failure(policy, attempt=1, max_attempts=5, retryable=True, rng=rng, retry_after_s=30)
    shorter = machine.after_failure(policy, attempt=3, max_attempts=5, retryable=True, rng=rng, retry_after_s=0.5)
    absurd = machine.after_failure(policy, attempt=1, max_attempts=5, retryable=True, rng=rng, retry_after_s=1e9)
    last = machine.after_failure(policy, attempt=5, max_attempts=5, retryable=True, rng=rng, retry_after_s=30)
    assert (asked.status, asked.delay_s) == (Status.RETRY_WAIT, 30.0)
    assert shorter.delay_s == 4.0
    assert absurd.delay_s == machine.MAX_RETRY_AFTER_S
    assert last.status is Status.FAILED


def test_a_retryable_failure_waits_while_attempts_remain():
    policy = machine.RetryPolicy(max_attempts=3, base_delay_s=1.0, max_delay_s=8.0, jitter=0.0)
    rng = random.Random(0)
    first = machine.after_failure(policy, attempt=1, max_attempts=3, retryable=True, rng=rng)
    second = machine.after_failure(policy, attempt=2, max_attempts=3, retryable=True, rng=rng)
    last = machine.after_failure(policy, attempt=3, max_attempts=3, retryable=True, rng=rng)
    assert (first.status, first.delay_s) == (Status.RETRY_WAIT, 1.0)
    assert (second.status, second.delay_s) == (Status.RETRY_WAIT, 2.0)
    assert last.status is Status.FAILED


def test_a_non_retryable_failure_ends_at_once():
    policy = machine.RetryPolicy(max_attempts=5)
    decision = machine.after_failure(policy, attempt=1, max_attempts=5, retryable=False, rng=random.Random(0))
    assert decision.status is Status.FAILED


def test_the_jobs_own_max_attempts_wins_over_the_policy():
    policy = machine.RetryPolicy(max_attempts=5, jitter=0.0)
    decision = machine.after_failure(policy, attempt=2, max_attempts=2, retryable=True, rng=random.Random(0))
    assert decision.status is Status.FAILED
