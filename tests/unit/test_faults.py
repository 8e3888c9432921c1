"""The fault-injecting wrapper around provider calls."""

from __future__ import annotations

import random
import threading
import time

import pytest
from castad_runtime.stage import errors, faults


def call_many(injector: faults.FaultInjector, count: int) -> tuple[int, list[errors.ProviderError]]:
    successes, failures = 0, []
    for _ in range(count):
        try:
            injector.call(lambda: "ok")
            successes += 1
        except errors.ProviderError as error:
            failures.append(error)
    return successes, failures


def test_no_faults_calls_through():
    injector = faults.FaultInjector(faults.Faults(), random.Random(0))
    assert not injector.faults.active
    assert call_many(injector, 100) == (100, [])


def test_the_failure_rate_is_the_share_of_failed_calls():
    injector = faults.FaultInjector(faults.Faults(failure_rate=0.3), random.Random(42))
    successes, failures = call_many(injector, 2000)
    assert 0.25 < len(failures) / 2000 < 0.35
    assert all(error.retryable and error.code == "injected_fault" for error in failures)


def test_injected_failures_can_be_permanent():
    injector = faults.FaultInjector(faults.Faults(failure_rate=1.0, retryable=False), random.Random(0))
    with pytest.raises(errors.ProviderError) as raised:
        injector.call(lambda: "never")
    assert not raised.value.retryable


def test_latency_delays_every_call():
    injector = faults.FaultInjector(faults.Faults(latency_s=0.05), random.Random(0))
    started = time.monotonic()
    assert injector.call(lambda: 1) == 1
    assert time.monotonic() - started >= 0.05


def test_a_hanging_call_never_returns():
    injector = faults.FaultInjector(faults.Faults(hang_rate=1.0), random.Random(0))
    returned = threading.Event()

    def call() -> None:
        injector.call(lambda: None)
        returned.set()

    threading.Thread(target=call, daemon=True).start()
    assert not returned.wait(0.3)
