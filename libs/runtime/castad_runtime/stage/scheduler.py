"""Wakes a stage service's own due work: new jobs, due retries, expired leases.

Jobs are claimed from the database only when a slot of the local pool is free, so
nothing waits in worker memory: a due retry stays a row with `due_at` until a slot
takes it. Handlers call `wake()` after committing a new job for a prompt start;
`poll_s` bounds how late a retry or an expired lease is noticed. Expired leases are
looked for once per `poll_s`, not on every wake-up: a wake-up is about new work, and
a look costs a transaction.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

import sqlalchemy as sa

from castad_runtime.stage import runner as runner_

log = logging.getLogger(__name__)
RECOVER_BATCH = 20  # expired leases recovered per look; after a full one, the next turn looks again


class JobScheduler:
    def __init__(self, runner: runner_.StageRunner, concurrency: int, poll_s: float) -> None:
        if concurrency < 1 or poll_s <= 0:
            raise ValueError("concurrency must be >= 1 and poll_s > 0")
        self.runner = runner
        self.poll_s = poll_s
        self._slots = threading.Semaphore(concurrency)
        self._pool = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="stage")
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Stop claiming; let running attempts finish."""
        self._stopping.set()
        self._wake.set()
        self._thread.join()
        self._pool.shutdown(wait=True)

    def _loop(self) -> None:
        recover_at = 0.0
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                due = time.monotonic() >= recover_at
                if due and self.runner.recover_expired_leases(RECOVER_BATCH) < RECOVER_BATCH:
                    recover_at = time.monotonic() + self.poll_s
                self._fill_slots()
            except sa.exc.SQLAlchemyError:
                log.exception("scheduler could not reach its database; trying again")
            self._wake.wait(self.poll_s)

    def _fill_slots(self) -> None:
        while not self._stopping.is_set() and self._slots.acquire(blocking=False):
            try:
                claim = self.runner.claim_next()
            except BaseException:
                self._slots.release()
                raise
            if claim is None:
                self._slots.release()
                return
            self._pool.submit(self._run, claim)

    def _run(self, claim: runner_.Claim) -> None:
        try:
            self.runner.execute(claim)
        except Exception:
            log.exception("attempt of job %s could not be recorded; its lease will expire", claim.job.id)
        finally:
            self._slots.release()
            self._wake.set()
