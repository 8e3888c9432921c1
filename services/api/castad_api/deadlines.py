"""The gateway wakes its own due records: pipelines past their deadline are canceled (deadline_exceeded).

And drafts whose review timed out undecided are settled: approved, or their pipeline canceled (review_timeout),
as their review says (reviews.py).

So that even an event lost to a bug cannot leave a pipeline open for ever. Several gateway
replicas share the work: each takes the overdue pipelines the others have not locked.
"""

from __future__ import annotations

import logging
import threading

import sqlalchemy as sa
from castad_runtime import backoff, db, outages, redact

from castad_api import decisions, operations

log = logging.getLogger(__name__)
BATCH = 100


class DeadlineSweeper:
    def __init__(self, engine: sa.Engine, poll_s: float) -> None:
        self.engine = engine
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="deadlines", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        delays = backoff.Backoff(first_s=self.poll_s, max_s=max(self.poll_s, 30.0))
        while not self._stop.is_set():
            try:
                with db.transaction(self.engine) as conn:
                    canceled = operations.cancel_overdue(conn, BATCH)
                with db.transaction(self.engine) as conn:
                    timed_out = decisions.settle_timed_out(conn, BATCH)
            except Exception as error:
                if not outages.is_outage(error):
                    log.exception("looking for overdue pipelines failed; trying again")
                elif delays.tries % 10 == 0:
                    log.warning("cannot look for overdue pipelines (%s); trying again", redact.describe(error))
                self._stop.wait(delays.next_s())
                continue
            delays.tries = 0
            if canceled:
                log.warning("canceled %d pipelines past their deadline", canceled)
            if timed_out:
                log.info("settled %d drafts whose review timed out undecided", timed_out)
            if canceled < BATCH and timed_out < BATCH:
                self._stop.wait(self.poll_s)
