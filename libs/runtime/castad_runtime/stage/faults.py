"""Fault injection around a stage's provider call, for tests and demos."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from castad_runtime.stage import errors

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Faults:
    failure_rate: float = 0.0
    retryable: bool = True
    latency_s: float = 0.0
    hang_rate: float = 0.0

    @property
    def active(self) -> bool:
        return bool(self.failure_rate or self.latency_s or self.hang_rate)


class FaultInjector:
    """Before each call: wait `latency_s`, then hang with `hang_rate`, or fail with `failure_rate`."""

    def __init__(self, faults: Faults, rng: random.Random | None = None) -> None:
        self.faults = faults
        self.rng = rng or random.Random()
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], T]) -> T:
        if self.faults.latency_s:
            time.sleep(self.faults.latency_s)
        with self._lock:
            hang, fail = self.rng.random(), self.rng.random()
        if hang < self.faults.hang_rate:
            threading.Event().wait()
        if fail < self.faults.failure_rate:
            kind = "retryable" if self.faults.retryable else "permanent"
            raise errors.ProviderError(
                "injected_fault",
                f"{kind} fault injected by CASTAD_*_FAULT_* settings",
                retryable=self.faults.retryable,
            )
        return fn()
