"""The fault-injecting wrapper around provider calls."""

from __future__ import annotations

import random
import threading
import time

import pytest
from castad_runtime.stage import cancellation, errors, faults


def call_many(injector: faults.FaultInjector, count: int) -> tuple[int, list[errors.ProviderError]]:
    successes, failures = 0, []
    for _ in range(count):
        try:
            injector.call(lambda: "ok", cancellation.Cancellation())
            successes += 1
        except errors.ProviderError as error:
            failures.append(error)
    return successes, failures


def test_no_faults_calls_through():
    injector = faults.FaultInjector(faults.Faults(), random.Random(0))
    assert not injector.current().active
    assert call_many(injector, 100) == (100, [])


def test_the_failure_rate_is_the_share_of_failed_calls():
    injector = faults.FaultInjector(faults.Faults(failure_rate=0.3), random.Random(42))
    successes, failures = call_many(injector, 2000)
    assert 0.25 < len(failures) / 2000 < 0.35
    assert all(error.retryable and error.code == "injected_fault" for error in failures)


def test_injected_failures_can_be_permanent():
    injector = faults.FaultInjector(faults.Faults(failure_rate=1.0, retryable=False), random.Random(0))
    with pytest.raises(errors.ProviderError) as raised:
        injector.call(lambda: "never", cancellation.Cancellation())
    assert not raised.value.retryable


def test_latency_delays_every_call():
    injector = faults.FaultInjector(faults.Faults(latency_s=0.05), random.Random(0))
    started = time.monotonic()
    assert injector.call(lambda: 1, cancellation.Cancellation()) == 1
    assert time.monotonic() - started >= 0.05


def test_a_hanging_call_hangs_until_its_attempt_is_cancelled():
    injector = faults.FaultInjector(faults.Faults(hang_rate=1.0), random.Random(0))
    cancel = cancellation.Cancellation()
    outcome: list[BaseException] = []
    returned = threading.Event()

    def call() -> None:
        try:
            injector.call(lambda: None, cancel)
        except cancellation.Cancelled as error:
            outcome.append(error)
        returned.set()

    threading.Thread(target=call, daemon=True).start()
    assert not returned.wait(0.3)
    cancel.cancel(cancellation.Reason.TIMEOUT)
    assert returned.wait(2)
    assert [error.reason for error in outcome] == [cancellation.Reason.TIMEOUT]


def test_a_cancelled_attempt_stops_waiting_out_its_latency():
    injector = faults.FaultInjector(faults.Faults(latency_s=30), random.Random(0))
    cancel = cancellation.Cancellation()
    threading.Timer(0.1, cancel.cancel, [cancellation.Reason.SHUTDOWN]).start()
    started = time.monotonic()
    with pytest.raises(cancellation.Cancelled):
        injector.call(lambda: "never", cancel)
    assert time.monotonic() - started < 5


def test_permanent_and_retryable_rates_add_up_with_separate_kinds():
    injector = faults.FaultInjector(faults.Faults(failure_rate=0.3, permanent_rate=0.1), random.Random(7))
    successes, failures = call_many(injector, 3000)
    permanent = [error for error in failures if not error.retryable]
    assert 0.07 < len(permanent) / 3000 < 0.13
    assert 0.35 < len(failures) / 3000 < 0.45
    assert successes == 3000 - len(failures)


def test_a_child_process_dies_with_the_service_that_started_it(tmp_path):
    """A service killed with SIGKILL (no chance to cancel anything) takes its children along."""
    import os
    import signal
    import subprocess
    import sys

    pid_file = tmp_path / "child.pid"
    script = (
        "import pathlib, sys\n"
        "from castad_runtime.stage import cancellation\n"
        f"cancellation.Cancellation().run(['sh', '-c', 'echo $$ > {pid_file}; exec sleep 60'])\n"
    )
    service = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.02)
    child = int(pid_file.read_text())

    service.send_signal(signal.SIGKILL)
    service.wait(10)

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError(f"child {child} outlived its killed service")
