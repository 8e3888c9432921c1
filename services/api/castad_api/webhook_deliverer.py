"""The gateway's sender of due notices, several at once, each try recorded; several replicas share them.

The gateway wakes its own due deliveries (`Deliverer`), several at once (so many per receiving host,
webhook_slots.py, so that a slow receiver delays only its own): it POSTs the notice (webhook_sender.py) with the
`webhook-id` (the same on every try), `webhook-timestamp` and `webhook-signature` headers, records every try, and
tries again with a capped backoff until a 2xx answer or the last try. A try gives its place back when it ends,
however it ends; a try whose record fails for a reason of its own (not the database being out) is left
unrecorded, and its notice is sent again when its lease ends, like one whose gateway died. Its statements on the
notices are webhooks.py's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import queue
import random
import threading
import time
import uuid
from concurrent import futures
from typing import Any

import sqlalchemy as sa
from castad_runtime import backoff, db, outages, redact

from castad_api import webhook_secrets, webhook_slots, webhooks
from castad_api.settings import ApiSettings
from castad_api.webhook_sender import Outcome, Sender

log = logging.getLogger(__name__)
ERROR_MAX_CHARS = 500


@dataclasses.dataclass(frozen=True)
class Due:
    """A notice taken for a try; `attempts` counts this try."""

    id: uuid.UUID
    pipeline_id: uuid.UUID
    url: str
    payload: dict[str, Any]
    attempts: int
    tenant: str = ""  # whose secrets sign it


@dataclasses.dataclass(frozen=True)
class Tried:
    """A try that came back (or ran out of time), waiting to be recorded."""

    delivery: Due
    outcome: Outcome
    started: dt.datetime
    elapsed_ms: int


class Deliverer:
    """The gateway's sender of due notices, several at once; several gateway replicas share them.

    One thread claims due notices for the places free (webhook_slots.py: CASTAD_API_WEBHOOK_CONCURRENCY in
    all, CASTAD_API_WEBHOOK_PER_HOST to one receiving host), hands each to a pool of as many threads that
    send it, and records the tries that came back, several in one transaction. A try's place is free again
    as soon as it ends, recorded or not. A claim leases its notices (no other replica takes them meanwhile)
    for longer than a try; a gateway that dies mid-try, or a try that cannot be recorded, leaves them to be
    tried again when the lease ends: at least once, never lost."""

    def __init__(self, engine: sa.Engine, config: ApiSettings, sender: Sender | None = None) -> None:
        self.engine = engine
        self.config = config
        key = config.webhook_secrets_key
        self.sealer = webhook_secrets.Sealer.of(key.get_secret_value()) if key is not None else None
        self.shared = [config.webhook_secret.get_secret_value()] if config.webhook_secret is not None else []
        self.sender = sender or Sender(config.webhook_allow_private, config.webhook_timeout_s)
        self.slots = webhook_slots.Slots(config.webhook_concurrency, config.webhook_per_host)
        self._pool = futures.ThreadPoolExecutor(config.webhook_concurrency, thread_name_prefix="webhook")
        self._tried: queue.SimpleQueue[Tried] = queue.SimpleQueue()
        self._unrecorded: list[Tried] = []  # came back, not yet recorded (kept while the database is out)
        self._came_back = threading.Event()
        self._rng = random.Random()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="webhooks", daemon=True)

    def start(self) -> None:
        if self.config.webhook_secret is not None:
            log.warning(
                "CASTAD_API_WEBHOOK_SECRET is set: every notice is also signed with a secret every tenant may hold;"
                " unset it once receivers verify with their tenant's own (castad-admin webhook-secrets)"
            )
        if self.sealer is not None or self.shared:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._came_back.set()
        if self._thread.is_alive():
            self._thread.join(self.sender.deadline_s + 5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.sender.close()

    def run_once(self) -> int:
        """Send the notices due now, as many at once as there are places, and record their tries.

        How many were tried.
        """
        self._record_tried()
        tried = self._dispatch()[0]
        self._finish(time.monotonic() + self.sender.deadline_s + 5)
        return tried

    def _dispatch(self) -> tuple[int, bool]:
        """Claim due notices for the free places and hand them to the pool.

        How many, and whether more may be due now (the claim found as many as it asked for).
        """
        free = self.slots.free()
        if free == 0:
            return 0, False
        claimed: list[tuple[Due, str]] = []
        try:
            with db.transaction(self.engine) as conn:
                more = self._claim(conn, free, claimed)
                signing: dict[str, list[str] | str] = {}
                for delivery, _ in claimed:
                    if delivery.tenant not in signing:
                        signing[delivery.tenant] = self._secrets(conn, delivery.tenant)
        except BaseException:  # nothing claimed: the places are free again
            for _, host in claimed:
                self.slots.give_back(host)
            raise
        for n, (delivery, host) in enumerate(claimed):
            try:
                self._pool.submit(self._try, delivery, host, signing[delivery.tenant])
            except BaseException:  # the pool is shut down: the rest are sent when their leases end
                for _, unsent in claimed[n:]:
                    self.slots.give_back(unsent)
                raise
        return len(claimed), more

    def _try(self, delivery: Due, host: str, signing: list[str] | str) -> None:
        """Send one notice (on a thread of the pool), hand its try back to be recorded, and give its place back."""
        started = dt.datetime.now(dt.UTC)
        clock = time.monotonic()
        outcome = Outcome(error="the try ended before its answer was read")  # replaced unless the thread dies
        try:
            if isinstance(signing, str):  # nothing to sign with: a failed try, tried again (a secret may come)
                outcome = Outcome(error=signing)
            else:
                payload = webhooks.with_decide_link(delivery.payload, self.config.link_secret)
                body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
                outcome = self.sender.send(str(delivery.id), delivery.url, body, signing)
        except Exception as error:  # a failed try, recorded as such
            log.exception("sending notice %s failed", delivery.id)
            outcome = Outcome(error=redact.describe(error))
        finally:  # queued before the place is given back: once none is in flight, every try is queued
            elapsed_ms = round((time.monotonic() - clock) * 1000)
            self._tried.put(Tried(delivery, outcome, started, elapsed_ms))
            self.slots.give_back(host)
            self._came_back.set()

    def _record_tried(self) -> int:
        """Record the tries that came back, in one transaction; how many were recorded.

        Each in a savepoint of its own: one whose record fails for a reason of its own is logged and left
        unrecorded (its notice is sent again when its lease ends, as if its gateway had died) without holding
        back the others. The database being out fails them all, kept for the next call.
        """
        while True:
            try:
                self._unrecorded.append(self._tried.get_nowait())
            except queue.Empty:
                break
        if not self._unrecorded:
            return 0
        recorded = 0
        try:
            with db.transaction(self.engine) as conn:
                for tried in self._unrecorded:
                    if self._record_one(conn, tried):
                        recorded += 1
        except Exception as error:
            if outages.is_outage(error):
                raise
            log.exception(
                "recording %d tries failed; their notices are sent again when their leases end", len(self._unrecorded)
            )
            recorded = 0
        self._unrecorded = []
        return recorded

    def _record_one(self, conn: sa.Connection, tried: Tried) -> bool:
        """Record one try in a savepoint; whether it was (False: it failed for a reason of its own, logged)."""
        try:
            with conn.begin_nested():
                self._record(conn, tried.delivery, tried.outcome, tried.started, tried.elapsed_ms)
        except Exception as error:
            if outages.is_outage(error):
                raise
            log.exception(
                "recording try %s of notice %s failed; the notice is sent again when its lease ends",
                tried.delivery.attempts,
                tried.delivery.id,
            )
            return False
        return True

    def _finish(self, until: float) -> None:
        """Wait for the tries in flight (until the monotonic time `until`), recording them as they come back."""
        while self.slots.in_flight() and time.monotonic() < until:
            self._came_back.wait(max(until - time.monotonic(), 0.0))
            self._came_back.clear()
            self._record_tried()
        self._record_tried()  # the last to come back may have been queued after the look above

    def _secrets(self, conn: sa.Connection, tenant: str) -> list[str] | str:
        """The secrets that sign a notice of `tenant`, or why there are none.

        Its own, newest first, then the shared one.
        """
        own: list[str] = []
        if self.sealer is not None:
            try:
                own = webhook_secrets.signing(conn, self.sealer, tenant)
            except webhook_secrets.Unreadable as error:
                log.error(
                    "cannot sign a notice: %s (is CASTAD_API_WEBHOOK_SECRETS_KEY the one it was made with?)", error
                )
                return f"cannot sign: a webhook secret of tenant {tenant!r} does not open with this gateway's key"
        if not own and not self.shared:
            return (
                f"tenant {tenant!r} has no valid webhook secret: castad-admin webhook-secrets create --tenant {tenant}"
            )
        return own + self.shared

    def _claim(self, conn: sa.Connection, free: int, taken: list[tuple[Due, str]]) -> bool:
        """Claim up to `free` of the most overdue notices into `taken`; whether more may be due now.

        Each has a place of its host taken, and is counted as tried and due again after a lease longer than a try,
        so that no other replica takes it meanwhile, and a gateway that dies mid-try leaves it to be tried again.

        The notices of hosts with no place left are passed over in the query, so that one host's backlog
        cannot hide the others' notices behind it."""
        rows = webhooks.due(conn, free, self.slots.full_hosts())
        spent = []
        for row in rows:
            if row.attempts >= self.config.webhook_max_attempts:  # its last try never came back (a gateway died)
                spent.append(row.id)
                continue
            host = row.host if row.host is not None else webhook_slots.host(row.url)
            if self.slots.take(host):  # else its host filled up within this claim: left for a later one
                taken.append(
                    (Due(row.id, row.pipeline_id, row.url, row.payload, row.attempts + 1, row.tenant or ""), host)
                )
        if spent:
            webhooks.give_up(conn, spent, "no answer was recorded for its last try")
        if taken:
            lease = dt.timedelta(seconds=2 * self.config.webhook_timeout_s + 30)
            webhooks.lease(conn, [delivery.id for delivery, _ in taken], lease)
        # More may be due when the claim was cut at its limit; not when it took nothing (it would find the same).
        return len(rows) == free and bool(taken or spent)

    def _record(self, conn: sa.Connection, delivery: Due, outcome: Outcome, started: dt.datetime, ms: int) -> None:
        error = outcome.error or (None if outcome.delivered else f"answered {outcome.status_code}")
        error = error and error[:ERROR_MAX_CHARS]
        webhooks.record_try(conn, delivery.id, delivery.attempts, started, ms, outcome.status_code, error)
        values: dict[str, Any] = {"last_error": error}
        if outcome.delivered:
            values.update(status="delivered", finished_at=sa.func.now())
        elif outcome.blocked or delivery.attempts >= self.config.webhook_max_attempts:
            values.update(status="failed", finished_at=sa.func.now())
            log.warning("notice %s of pipeline %s failed for good: %s", delivery.id, delivery.pipeline_id, error)
        else:
            delay = backoff.exponential_s(
                delivery.attempts - 1,
                self.config.webhook_backoff_base_s,
                self.config.webhook_backoff_max_s,
                0.2,
                self._rng,
            )
            values["due_at"] = sa.func.now() + dt.timedelta(seconds=delay)
        webhooks.settle(conn, delivery.id, delivery.attempts, values)

    def _loop(self) -> None:
        delays = backoff.Backoff(first_s=self.config.webhook_poll_s, max_s=max(self.config.webhook_poll_s, 30.0))
        while not self._stop.is_set():
            self._came_back.clear()  # before looking: a try that comes back after it wakes the wait below
            try:
                self._record_tried()
                more = self._dispatch()[1]
            except Exception as error:
                if not outages.is_outage(error):
                    log.exception("sending notices failed; trying again")
                self._stop.wait(delays.next_s())
                continue
            delays.tries = 0
            if not more:  # nothing more due now, or no place free: until a try comes back, or the next look
                self._came_back.wait(self.config.webhook_poll_s)
        try:  # the tries in flight are recorded; one that is not is sent again when its lease ends
            self._finish(time.monotonic() + self.sender.deadline_s)
        except Exception as error:
            if not outages.is_outage(error):
                log.exception("recording the last tries failed; they are sent again when their leases end")
