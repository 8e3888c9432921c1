"""Wakes a stage service's own due work: new jobs, due retries, expired leases, drafts whose review timed out.

Jobs are claimed from the database only when a slot of the local pool is free, so
nothing waits in worker memory: a due retry stays a row with `due_at` until a slot
takes it. Handlers call `wake()` after committing a new job for a prompt start. While
the last look left due work for want of a slot, a slot whose attempt ends claims the
next job in the transaction that records the outcome (no transaction of its own for
that claim); a freed slot wakes the scheduler only if that backlog remains, or if the
attempt that held it did not succeed (its job may be due again at once);
`poll_s` bounds how late a retry or an expired lease is noticed. Expired leases are
looked for once per `poll_s`, not on every wake-up: a wake-up is about new work, and
a look costs a transaction; so are drafts whose review timed out (castad_runtime.stage.reviews), in a stage
that drafts. While the database is out, the loop backs off.

A trigger's handler may claim its new job itself, in its own transaction, when a slot is free
and the scheduler's last look found nothing else due (`reserve`, then `run_claimed` once that
committed, or `release`): the job starts without a transaction of its own to claim it, and never
ahead of work that waited longer (before the scheduler's first look, no trigger claims: at a start,
retries and jobs accepted while the service was down may be due).

Stopping: no new claims; running attempts get `grace_s` to finish, then are cancelled
and handed back (not counted), so another worker or this service's next start picks
them up at once.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

from castad_runtime import backoff, outages, redact
from castad_runtime.stage import reviews as reviews_
from castad_runtime.stage import runner as runner_

log = logging.getLogger(__name__)
RECOVER_BATCH = 20  # expired leases recovered per look; after a full one, the next turn looks again
HAND_BACK_S = 10.0  # after the grace period: time for cancelled attempts to record their hand-back


class JobScheduler:
    def __init__(
        self,
        runner: runner_.StageRunner,
        concurrency: int,
        poll_s: float,
        grace_s: float = 20.0,
        drafts: reviews_.Reviews | None = None,
    ) -> None:
        if concurrency < 1 or poll_s <= 0 or grace_s < 0:
            raise ValueError("concurrency must be >= 1, poll_s > 0 and grace_s >= 0")
        self.runner = runner
        self.drafts = drafts
        self.poll_s = poll_s
        self.grace_s = grace_s
        self._slots = threading.Semaphore(concurrency)
        self._pool = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="stage")
        self._running = 0
        self._idle = threading.Condition()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._backlog = True  # no look yet, or the last one stopped with every slot taken: more may be due
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def reserve(self) -> bool:
        """Take a free slot for work claimed elsewhere.

        False if none is free or the scheduler stops. The slot counts as running (a stop waits for it) until
        `run_claimed` ran its attempt or `release`.
        """
        if self._stopping.is_set() or self._backlog or not self._slots.acquire(blocking=False):
            return False
        with self._idle:
            self._running += 1
        return True

    def release(self) -> None:
        """Give back a reserved slot that nothing was claimed for (the scheduler may have wanted it)."""
        self._slots.release()
        self._done()
        self._look_if_backlog()

    def run_claimed(self, claim: runner_.Claim) -> None:
        """Run an attempt claimed into a reserved slot.

        Handed back at once (not counted) if the scheduler stops meanwhile, as a stopping service starts no new
        attempt.
        """
        if not self._stopping.is_set():
            try:
                self._pool.submit(self._run, claim)
                return
            except RuntimeError:  # the pool shut down: the scheduler stopped
                pass
        try:
            self.runner.hand_back(claim, "the service stopped before the attempt began")
        finally:
            self.release()

    def threads(self) -> list[threading.Thread]:
        """The scheduler's own thread, once started (for the liveness probe)."""
        return [self._thread] if self._thread.ident is not None else []

    def stop(self) -> None:
        """Stop claiming; give running attempts `grace_s` to finish, then hand them back."""
        self._stopping.set()
        self._wake.set()
        self._thread.join()
        if not self._wait_idle(self.grace_s):
            interrupted = self.runner.interrupt_all()
            log.warning("%d attempts still running after %g s: handing them back", interrupted, self.grace_s)
            if not self._wait_idle(HAND_BACK_S):
                self.runner.give_up_recording()
                self._wait_idle(1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _wait_idle(self, timeout_s: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout_s)

    def _loop(self) -> None:
        recover_at = 0.0
        delays = backoff.Backoff(first_s=self.poll_s, max_s=max(self.poll_s, 5.0))
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                due = time.monotonic() >= recover_at
                if due and self.runner.recover_expired_leases(RECOVER_BATCH) < RECOVER_BATCH:
                    recover_at = time.monotonic() + self.poll_s
                self._fill_slots()
                if due:
                    self._expire_drafts()
            except Exception as error:
                if not outages.is_outage(error):
                    log.exception("scheduler turn failed; trying again")
                elif delays.tries % 10 == 0:
                    log.warning("scheduler cannot reach its database (%s); trying again", redact.describe(error))
                self._stopping.wait(delays.next_s())
                continue
            delays.tries = 0
            self._wake.wait(self.poll_s)

    def _expire_drafts(self) -> None:
        """Say which drafts' reviews timed out; a failure of its own is logged, and claiming goes on."""
        if self.drafts is None:
            return
        try:
            self.drafts.expire_due()
        except Exception as error:
            if outages.is_outage(error):
                raise  # the loop's backoff
            log.exception("looking for drafts whose review timed out failed; trying again")

    def _fill_slots(self) -> None:
        self._backlog = True
        while not self._stopping.is_set() and self._slots.acquire(blocking=False):
            try:
                claim = self.runner.claim_next()
            except BaseException:
                self._slots.release()
                raise
            if claim is None:
                self._slots.release()
                self._backlog = False
                return
            with self._idle:
                self._running += 1
            self._pool.submit(self._run, claim)

    def _run(self, claim: runner_.Claim | None) -> None:
        """Attempts in one slot: this claim's, then each next one its predecessor's outcome claimed with it."""
        ran: runner_.Ran | None = None
        try:
            while claim is not None:
                ran = None  # not the attempt before's, should this one's recording fail
                ran = self.runner.execute(claim, self._backlogged)
                claim = ran.next
                if claim is not None and self._stopping.is_set():  # claimed just as the stop began
                    self.runner.hand_back(claim, "the service stopped before the attempt began")
                    claim = None
        except Exception:
            assert claim is not None
            log.exception("attempt of job %s could not be recorded; its lease will expire", claim.job.id)
        finally:
            self._slots.release()
            self._done()
            if ran is not None and ran.succeeded:
                self._look_if_backlog()
            else:  # its job may be due again at once
                self._wake.set()

    def _backlogged(self) -> bool:
        """Whether a slot whose attempt ended should look for more work (with the outcome's transaction)."""
        return self._backlog and not self._stopping.is_set()

    def _look_if_backlog(self) -> None:
        """Look for due work after a slot was freed, if the last look left some for want of a slot.

        A look costs a transaction; new work wakes the scheduler itself. The slot is freed before this reads
        `_backlog`, and a look sets `_backlog` before it takes a slot, so no due job is left unseen.
        """
        if self._backlog:
            self._wake.set()

    def _done(self) -> None:
        with self._idle:
            self._running -= 1
            self._idle.notify_all()
