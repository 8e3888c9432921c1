"""The leases of the attempts a process runs: renewed by one heartbeat, and known held until when.

A claim holds its job under a lease the database dates: it runs out `lease_s` after the
transaction that claimed or last renewed it began, by the database's clock. This process
cannot read that clock, but it knows a moment at or before each of those transactions
began, by its own: the lease is known held until that moment plus `lease_s`. A process that
was frozen (stopped, paused, swapped out, its machine suspended) past that time, or whose
renewals failed for that long, no longer knows it holds the lease, and whatever it was about
to send out must not go (castad_runtime.stage.fence). The clock is the lease clock
(castad_runtime.clock), which counts a suspended machine's sleep.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable

import sqlalchemy as sa

from castad_runtime import clock as clock_
from castad_runtime import db, outages, redact
from castad_runtime.stage import repository
from castad_runtime.stage.repository import claiming

log = logging.getLogger(__name__)

Clock = clock_.Clock
clock = clock_.now


@dataclasses.dataclass
class _Held:
    job: repository.Job
    on_lost: Callable[[], None]
    until: float  # the lease is known held before this time of the clock


class Leases:
    """The heartbeat of the attempts this process runs.

    Their leases renewed every third of a lease, all in one transaction, by one thread (started with the first
    attempt, ended by a turn that found none). An attempt whose claim turns out to be lost (its lease was taken
    over, its job moved on) is told by its `on_lost`.
    """

    def __init__(self, engine: sa.Engine, lease_s: float, name: str, clock: Clock = clock) -> None:
        self.engine = engine
        self.lease_s = lease_s
        self.name = name
        self.clock = clock
        self._held: dict[uuid.UUID, _Held] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, job: repository.Job, on_lost: Callable[[], None], since: float) -> None:
        """Renew this claim's lease from now on, until `release`.

        `since`: a time of the clock at or before the claiming transaction began (the lease runs from then, at the
        earliest).
        """
        with self._lock:
            self._held[job.id] = _Held(job, on_lost, since + self.lease_s)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"{self.name}-leases", daemon=True)
                self._thread.start()

    def release(self, job_id: uuid.UUID) -> None:
        with self._lock:
            self._held.pop(job_id, None)

    def known_held(self, job: repository.Job, margin_s: float) -> bool:
        """Whether this claim's lease is known to be held for `margin_s` more at least (False once released)."""
        with self._lock:
            held = self._held.get(job.id)
            return held is not None and held.job is job and self.clock() + margin_s < held.until

    def confirmed(self, job: repository.Job, since: float, left_s: float) -> None:
        """The database said the lease had `left_s` left, in a statement sent at `since` (of the clock)."""
        with self._lock:
            held = self._held.get(job.id)
            if held is not None and held.job is job:
                held.until = max(held.until, since + left_s)

    def _loop(self) -> None:
        failures = 0
        while True:
            time.sleep(self.lease_s / 3)
            with self._lock:
                held = dict(self._held)
                if not held:
                    self._thread = None  # the next `hold` starts another
                    return
            began = self.clock()
            try:
                with db.transaction(self.engine) as conn:
                    renewed = claiming.renew_leases(conn, [each.job for each in held.values()], self.lease_s)
            except Exception as error:
                if not outages.is_outage(error):
                    log.exception("heartbeat of %d attempts failed; trying again", len(held))
                elif failures % outages.LOG_EVERY == 0:
                    log.warning("heartbeat: outage (%s); trying again", redact.describe(error))
                failures += 1
                continue
            failures = 0
            for job_id, each in held.items():
                with self._lock:
                    current = self._held.get(job_id)
                    if current is None or current.job is not each.job:
                        continue  # an attempt recorded meanwhile, or a new claim of the same job in its place
                    if job_id in renewed:
                        current.until = max(current.until, began + self.lease_s)
                        continue
                    del self._held[job_id]
                log.warning("claim of job %s lost: its lease was taken over or the job moved on", job_id)
                each.on_lost()
