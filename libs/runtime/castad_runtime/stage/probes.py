"""Polls of work waiting at a provider, a batch at a time.

Polled by a claim each, a job AWAITING its provider cost a transaction to claim it, a worker slot and its
supervision, and a transaction to record "not yet": 9.4 ms of the stage's CPU and 1.4 commits a poll
(docs/reports/capacity.md), so that a million jobs waiting would need hundreds of cores (issue 37). The prober, a
thread of the stage service, instead:

1. claims up to `batch` jobs whose poll is due in one transaction (`polls.claim_probes`), taking their calls'
   tokens from the provider's quota in it (fewer jobs when fewer tokens are left), never more than its `threads`
   can ask at once and as many again waiting for a thread;
2. polls each on one of its `threads`, outside any transaction (`remote.probe`);
3. records the outcomes that came since its last look in one transaction (`polls.record_probes`): work not
   had yet is due again after its wait; work done or failed, or waited past its give-up time, is made ready, as
   a provider's callback makes it.

It looks every `pace_s` while polls are under way (so a batch of outcomes is recorded together, and a slow answer
holds up no other), at once while due polls fill every free thread, and every `idle_s` when none are due.

A claim of the runner then takes a ready job, polls it once more and does the rest (fetches the result, fails the
attempt), so the runner alone decides what an attempt comes to, and the prober only when. A probe's claim is the
job's due_at pushed `lease_s` on: a process that dies mid-batch leaves its jobs due again then, and a callback or
an operator's cancel meanwhile wins (an outcome is recorded only on a row still as its probe claimed it). A "too
many" answer throttles the quota as the runner's would, and while work is due for the runner's claims (a job ready
to complete, one to start) the prober takes at most half the quota's tokens. A poll that takes longer than
`timeout_s` is cancelled and its job made ready, so a provider that hangs ties up neither a thread nor the job (the
runner's claim polls it under its attempt's time limit). Provider faults injected for tests (CASTAD_<STAGE>_FAULT_*)
apply to these polls as to the runner's calls (the stage service wraps `probe` in its injector).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

import sqlalchemy as sa

from castad_runtime import backoff, db, metrics, outages, redact
from castad_runtime.stage import cancellation, errors, quota, remote
from castad_runtime.stage.repository import claiming, polls

log = logging.getLogger(__name__)


class Prober:
    def __init__(
        self,
        engine: sa.Engine,
        probe: remote.Probe,
        *,
        provider: str | None,
        batch: int,
        threads: int,
        lease_s: float,
        timeout_s: float,
        pace_s: float = 0.05,
        idle_s: float = 0.25,
        metrics: metrics.StageMetrics | None = None,
    ) -> None:
        if batch < 1 or threads < 1 or min(lease_s, timeout_s, pace_s, idle_s) <= 0:
            raise ValueError("batch and threads must be >= 1, lease_s, timeout_s, pace_s and idle_s > 0")
        self.engine = engine
        self.probe = probe
        self.provider = provider
        self.batch = batch
        self.lease_s = lease_s
        self.timeout_s = min(timeout_s, lease_s)  # past its lease the probe's claim is void anyway
        self.pace_s = pace_s
        self.idle_s = idle_s
        self.metrics = metrics
        self.room = 2 * threads  # polls claimed and not yet recorded, at most
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="probe")
        self._stopping = threading.Event()
        self._lock = threading.Condition()
        self._asking: dict[cancellation.Cancellation, float] = {}  # polls under way: when each is up
        self._under_way = 0  # claimed, not yet recorded
        self._answered: list[tuple[polls.Probe, remote.Later | None]] = []
        self._thread = threading.Thread(target=self._loop, name="prober", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def threads(self) -> list[threading.Thread]:
        """The prober's own thread, once started (for the liveness probe)."""
        return [self._thread] if self._thread.ident is not None else []

    def stop(self) -> None:
        """Stop: polls under way are cancelled, and what every poll found is recorded (due again at once)."""
        self._stopping.set()
        with self._lock:
            asking = list(self._asking)
        for cancel in asking:
            cancel.cancel(cancellation.Reason.SHUTDOWN)
        if self._thread.ident is not None:
            self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def turn(self) -> int:
        """Claim one batch of due polls, wait for them all, record what they found; how many were claimed."""
        claimed = self._claim(self.batch)
        with self._lock:
            self._lock.wait_for(lambda: len(self._answered) == self._under_way)
        self._record()
        return claimed

    def _claim(self, wanted: int) -> int:
        """Claim up to `wanted` due polls (fewer if the quota has fewer tokens) and hand them to the threads."""
        with db.transaction(self.engine) as conn:
            limit, tokens = wanted, None
            if self.provider is not None:
                tokens = quota.hold_tokens(conn, self.provider)
                # Work due for the runner (a job ready to complete, one to start) gets half the tokens at least:
                # the prober looks far more often than a scheduler claims, and would otherwise take them all.
                share = tokens.count // 2 if tokens.count and claiming.claims_due(conn) else tokens.count
                limit = min(limit, share)
            claimed = polls.claim_probes(conn, limit, self.lease_s) if limit > 0 else []
            if tokens is not None:
                quota.spend_tokens(conn, tokens, len(claimed))
        with self._lock:
            self._under_way += len(claimed)
        for job in claimed:
            self._pool.submit(self._ask, job)
        return len(claimed)

    def _ask(self, job: polls.Probe) -> None:
        """One poll; None makes the job ready for a claim, also when the poll itself broke (the claim sees why)."""
        cancel = cancellation.Cancellation()
        with self._lock:
            self._asking[cancel] = time.monotonic() + self.timeout_s
        answer: remote.Later | None
        try:
            answer = remote.Later(0.0, asked=False) if self._stopping.is_set() else self.probe(job, cancel)
        except cancellation.Cancelled as cancelled:
            if cancelled.reason is cancellation.Reason.TIMEOUT:
                log.warning("polling %s took more than %g s; a claim takes the job", job.handle, self.timeout_s)
                answer = None
            else:
                answer = remote.Later(0.0, asked=False)  # the service stops: due again as soon as a process asks
        except errors.ProviderError as error:  # raised around the poll (injected faults): a claim polls again
            log.warning("polling %s failed (%s); a claim takes the job", job.handle, error.code)
            answer = None
        except Exception:
            log.exception("polling %s broke; a claim takes the job", job.handle)
            answer = None
        with self._lock:
            del self._asking[cancel]
            self._answered.append((job, answer))
            self._lock.notify_all()

    def _record(self) -> int:
        """Record in one transaction what the polls answered since the last time; how many."""
        with self._lock:
            answered, self._answered = self._answered, []
        if not answered:
            return 0
        outcomes = [
            polls.Probed(job, ready=True)
            if answer is None
            else polls.Probed(job, ready=False, wait_s=answer.wait_s, asked=answer.asked)
            for job, answer in answered
        ]
        went = any(answer is not None and answer.asked for _, answer in answered)
        throttled = [
            answer.throttled_s for _, answer in answered if answer is not None and answer.throttled_s is not None
        ]
        try:
            with db.transaction(self.engine) as conn:
                polls.record_probes(conn, outcomes)
                if self.provider is not None and throttled:
                    quota.throttled(conn, self.provider, max(throttled))
                elif self.provider is not None and went:
                    quota.relieved(conn, self.provider)
        except BaseException:
            with self._lock:  # recorded at the next look; the probes' claims hold them until then
                self._answered = answered + self._answered
            raise
        with self._lock:
            self._under_way -= len(answered)
        if self.metrics is not None:
            ready = sum(outcome.ready for outcome in outcomes)
            self.metrics.probed(len(outcomes) - ready, ready)
            if self.provider is not None and throttled:
                self.metrics.provider_throttled(self.provider)
        return len(answered)

    def _cancel_late(self) -> None:
        """Cancel the polls under way longer than `timeout_s`."""
        now = time.monotonic()
        with self._lock:
            late = [cancel for cancel, up_at in self._asking.items() if up_at <= now]
        for cancel in late:
            cancel.cancel(cancellation.Reason.TIMEOUT)

    def _loop(self) -> None:
        delays = backoff.Backoff(first_s=self.idle_s, max_s=5.0)
        while not self._stopping.is_set():
            try:
                self._cancel_late()
                self._record()
                with self._lock:
                    free = min(self.batch, self.room - self._under_way)
                claimed = self._claim(free) if free > 0 else 0
            except Exception as error:
                if not outages.is_outage(error):
                    log.exception("a batch of polls failed; trying again")
                elif delays.tries % 10 == 0:
                    log.warning("the prober cannot reach its database (%s); trying again", redact.describe(error))
                self._stopping.wait(delays.next_s())
                continue
            delays.tries = 0
            if free > 0 and claimed == free:
                continue  # more may be due: claim again once these are recorded
            with self._lock:
                waiting = self._under_way > 0
            self._stopping.wait(self.pace_s if waiting else self.idle_s)
        self._finish()

    def _finish(self) -> None:
        """At a stop: wait for the polls under way (cancelled) and record what they found, while the database lets."""
        with self._lock:
            self._lock.wait_for(lambda: len(self._answered) == self._under_way, timeout=10.0)
        try:
            self._record()
        except Exception as error:
            log.warning("stopping with %d polls unrecorded: %s", self._under_way, redact.describe(error))
