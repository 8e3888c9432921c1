"""Fault injection around a stage's provider call, for tests, demos and the fault harness."""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable
from typing import TypeVar

from castad_contracts import codes

from castad_runtime.stage import cancellation, errors

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Faults:
    failure_rate: float = 0.0
    retryable: bool = True
    latency_s: float = 0.0
    hang_rate: float = 0.0
    permanent_rate: float = 0.0
    handler_rate: float = 0.0

    @property
    def active(self) -> bool:
        return bool(self.failure_rate or self.latency_s or self.hang_rate or self.permanent_rate or self.handler_rate)


class InjectedHandlerFault(RuntimeError):
    """A fault injected into the handling of a stage's trigger (a bug that keeps failing)."""


class FaultInjector:
    """Delay, hang or fail provider calls at the configured rates.

    Before each call: wait `latency_s`, then hang with `hang_rate` (until the attempt is cancelled), fail
    non-retryably with `permanent_rate`, or fail with `failure_rate` (retryable as `retryable` says).
    """

    def __init__(self, faults: Faults, rng: random.Random | None = None) -> None:
        self.faults = faults
        self.rng = rng or random.Random()
        self._lock = threading.Lock()

    def handler(self) -> None:
        """Before handling a trigger: fail with `handler_rate`, as a handler bug would."""
        with self._lock:
            fail = self.rng.random()
        if fail < self.faults.handler_rate:
            raise InjectedHandlerFault("handler fault injected by CASTAD_*_FAULT_HANDLER_RATE")

    def call(self, fn: Callable[[], T], cancel: cancellation.Cancellation) -> T:
        if self.faults.latency_s:
            cancel.sleep(self.faults.latency_s)
        with self._lock:
            hang, fail = self.rng.random(), self.rng.random()
        if hang < self.faults.hang_rate:
            cancel.sleep(None)
        if fail < self.faults.permanent_rate:
            raise errors.PermanentProviderError(
                codes.ErrorCode.INJECTED_FAULT, "permanent fault injected by CASTAD_*_FAULT_PERMANENT_RATE"
            )
        if fail < self.faults.permanent_rate + self.faults.failure_rate:
            kind = "retryable" if self.faults.retryable else "permanent"
            raise errors.ProviderError(
                codes.ErrorCode.INJECTED_FAULT,
                f"{kind} fault injected by CASTAD_*_FAULT_* settings",
                retryable=self.faults.retryable,
            )
        return fn()
