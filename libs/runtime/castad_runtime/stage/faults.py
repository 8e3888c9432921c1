"""Fault injection around a stage's provider call, for tests, demos and the fault harness.

The faults come from the stage's settings (CASTAD_<STAGE>_FAULT_*), or, with its fault switch on, from its own
table `injected_faults` while it runs (`Switch`): one stack of services then serves tests that each need other
faults, and a demo can break a provider and mend it again without a restart.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa
from castad_contracts import codes
from sqlalchemy.dialects import postgresql as pg

from castad_runtime import outages, tables
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


class Switch:
    """The faults set in the stage's `injected_faults` table while it runs; the configured ones while it is empty.

    Read at every provider call and trigger: only a service whose fault switch is on asks it (tests and demos).
    While the database is out, the configured ones: an outage must cost the work nothing, and the work goes on.
    """

    def __init__(self, engine: sa.Engine, configured: Faults) -> None:
        self.engine = engine
        self.configured = configured

    def __call__(self) -> Faults:
        try:
            with self.engine.connect() as conn:
                row = conn.execute(sa.select(tables.injected_faults)).mappings().first()
        except sa.exc.SQLAlchemyError as error:
            if not outages.is_outage(error):
                raise
            return self.configured
        if row is None:
            return self.configured
        return Faults(**{field.name: row[field.name] for field in dataclasses.fields(Faults)})


def inject(conn: sa.Connection, faults: Faults) -> None:
    """Set the faults a stage whose switch is on injects from now on (`Faults()`: none)."""
    values = dataclasses.asdict(faults)
    statement = pg.insert(tables.injected_faults).values(one=True, **values)
    conn.execute(statement.on_conflict_do_update(index_elements=["one"], set_={**values, "set_at": sa.func.now()}))


def clear(conn: sa.Connection) -> None:
    """Back to the configured faults."""
    conn.execute(tables.injected_faults.delete())


class InjectedHandlerFault(RuntimeError):
    """A fault injected into the handling of a stage's trigger (a bug that keeps failing)."""


class FaultInjector:
    """Delay, hang or fail provider calls at the configured rates.

    Before each call: wait `latency_s`, then hang with `hang_rate` (until the attempt is cancelled), fail
    non-retryably with `permanent_rate`, or fail with `failure_rate` (retryable as `retryable` says).
    """

    def __init__(self, faults: Faults | Callable[[], Faults], rng: random.Random | None = None) -> None:
        """`faults`: fixed ones, or where to read them before each call (a `Switch`)."""
        self.current = faults if callable(faults) else lambda: faults
        self.rng = rng or random.Random()
        self._lock = threading.Lock()

    def handler(self) -> None:
        """Before handling a trigger: fail with `handler_rate`, as a handler bug would."""
        faults = self.current()
        with self._lock:
            fail = self.rng.random()
        if fail < faults.handler_rate:
            raise InjectedHandlerFault("handler fault injected by CASTAD_*_FAULT_HANDLER_RATE")

    def call(self, fn: Callable[[], T], cancel: cancellation.Cancellation) -> T:
        faults = self.current()
        if faults.latency_s:
            cancel.sleep(faults.latency_s)
        with self._lock:
            hang, fail = self.rng.random(), self.rng.random()
        if hang < faults.hang_rate:
            cancel.sleep(None)
        if fail < faults.permanent_rate:
            raise errors.PermanentProviderError(
                codes.ErrorCode.INJECTED_FAULT, "permanent fault injected by CASTAD_*_FAULT_PERMANENT_RATE"
            )
        if fail < faults.permanent_rate + faults.failure_rate:
            kind = "retryable" if faults.retryable else "permanent"
            raise errors.ProviderError(
                codes.ErrorCode.INJECTED_FAULT,
                f"{kind} fault injected by CASTAD_*_FAULT_* settings",
                retryable=faults.retryable,
            )
        return fn()
