"""Notices to a brief's `callback_url` when its pipeline ends or a draft waits, signed as Standard Webhooks.

When the projection moves a pipeline to SUCCEEDED, FAILED or CANCELED, it adds a delivery
row in the same transaction (`enqueue`): a notice is never lost and never made twice for one
ending. So it does for each draft a stage made for a person to decide on (`review.requested`,
`enqueue_review`), whose notice carries the draft and a link, signed by the gateway, that shows it
and takes one decision on it without an API key (castad_runtime.links.review_link) until its review
times out. The gateway wakes its own due deliveries (`Deliverer`), several at once (so many per receiving
host, webhook_slots.py, so that a slow receiver delays only its own): it POSTs the notice with the
`webhook-id` (the same on every try), `webhook-timestamp` and `webhook-signature` headers
(HMAC-SHA256 with each valid `whsec_` secret of the pipeline's tenant, webhook_secrets.py,
https://www.standardwebhooks.com/), records every try, and tries again with a capped backoff
until a 2xx answer or the last try. The notice names its tenant. A try gives its place back when it
ends, however it ends; a try whose record fails for a reason of its own (not the database being out)
is left unrecorded, and its notice is sent again when its lease ends, like one whose gateway died.

A notice goes through the guarded client (castad_runtime.outbound): to an https URL, never to a
private, loopback, link-local or otherwise non-public address (the host is resolved, every address
checked, IPv4 inside IPv6 too, and the connection made to the checked address, so a second lookup
cannot change it), unless CASTAD_API_WEBHOOK_ALLOW_PRIVATE is set (plain http and private
addresses, for local receivers). A refused destination fails the delivery at once. Redirects are
not followed (a 3xx answer is a failed try), as Standard Webhooks advises; an answer's body is
read up to a few kilobytes, and a try that takes longer than its deadline is a failed try, so
no receiver holds a place for longer.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import hashlib
import hmac
import json
import logging
import queue
import random
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import httpx
import sqlalchemy as sa
from castad_contracts import api, events, ids
from castad_runtime import backoff, db, links, outages, outbound, redact
from castad_runtime.stage import cancellation
from psycopg.types.json import Jsonb
from pydantic import SecretStr
from sqlalchemy.dialects.postgresql import insert as pg_insert

from castad_api import model, records, webhook_secrets, webhook_slots
from castad_api.settings import ApiSettings
from castad_api.tables import pipelines, webhook_attempts, webhook_deliveries

log = logging.getLogger(__name__)
ERROR_MAX_CHARS = 500
ANSWER_MAX_BYTES = 16_384
REFUSED = "the destination is not allowed: not https, or not a public address"


def event_type(status: model.PipelineStatus) -> str:
    return f"pipeline.{status.value.lower()}"


def refusal(url: str, config: ApiSettings) -> str | None:
    """Why a brief's callback_url cannot be accepted now (before any DNS lookup), or None."""
    if config.webhook_secrets_key is None and config.webhook_secret is None:
        return "this gateway sends no notices: CASTAD_API_WEBHOOK_SECRETS_KEY is not set"
    try:
        outbound.check_url(url, config.webhook_allow_private)
    except outbound.Refused as error:
        return f"must be an https URL of a public address ({error})"
    return None  # a name: checked once resolved, at delivery


def tenant_refusal(conn: sa.Connection, tenant: str, config: ApiSettings) -> str | None:
    """Why the tenant's notices cannot be signed (it has no secret of its own, and none is shared), or None."""
    if config.webhook_secret is not None or webhook_secrets.has_valid(conn, tenant):
        return None
    return f"tenant {tenant!r} has no webhook secret: castad-admin webhook-secrets create --tenant {tenant}"


_ENQUEUE = (
    "INSERT INTO webhook_deliveries (id, pipeline_id, url, host, event_type, payload) VALUES (%s, %s, %s, %s, %s, %s)"
)


def enqueue(
    conn: sa.Connection,
    pipeline: records.Pipeline | records.Locked,
    status: model.PipelineStatus,
    error_code: str | None,
    artifacts: dict[str, Any],
) -> None:
    """Add the notice of a pipeline's end, if its brief asked for one (inside the projection's transaction)."""
    url = pipeline.callback_url
    if not url:
        return
    pipeline_id = str(pipeline.id)
    ended = event_type(status)
    data = {
        "id": pipeline_id,
        "tenant": pipeline.tenant,
        "status": status.value,
        "error_code": error_code if status is not model.PipelineStatus.SUCCEEDED else None,
        "artifacts": {
            stage: api.ArtifactLink.of(str(pipeline_id), events.Stage(stage), artifact).model_dump()
            for stage, artifact in artifacts.items()
        },
        "links": {"self": f"/v1/pipelines/{pipeline_id}"},
    }
    payload = {"type": ended, "timestamp": dt.datetime.now(dt.UTC).isoformat(), "data": data}
    # Time-ordered: one a pipeline, at the pipeline rate; the receiver checks the signature, not the id.
    row = (ids.time_ordered(), pipeline.id, url, webhook_slots.host(url), ended, Jsonb(payload))
    db.run(conn, _ENQUEUE, row)  # in the projection's pipeline


REVIEW_REQUESTED = "review.requested"


def enqueue_review(
    conn: sa.Connection, pipeline: records.Pipeline | records.Locked, draft: events.LyricDrafted
) -> None:
    """Add the notice that a draft waits for a person's decision, if the brief asked for notices."""
    url = pipeline.callback_url
    if not url:
        return
    pipeline_id = str(pipeline.id)
    data = {
        "id": pipeline_id,
        "tenant": pipeline.tenant,
        "status": model.PipelineStatus.AWAITING_REVIEW.value,
        "draft": {
            "id": draft.draft_id,
            "stage": draft.stage.value,
            "round": draft.round,
            "text": draft.lyrics.text(),
            "review_until": draft.review_until.isoformat(),
            "on_timeout": draft.on_timeout,
        },
        "links": {"self": f"/v1/pipelines/{pipeline_id}", "review": f"/v1/pipelines/{pipeline_id}/review"},
    }
    payload = {"type": REVIEW_REQUESTED, "timestamp": draft.drafted_at.isoformat(), "data": data}
    row = (ids.time_ordered(), pipeline.id, url, webhook_slots.host(url), REVIEW_REQUESTED, Jsonb(payload))
    db.run(conn, _ENQUEUE, row)


def with_decide_link(payload: dict[str, Any], link_secret: SecretStr | None) -> dict[str, Any]:
    """A `review.requested` notice with its signed link to decide (`links.decide`), given the gateway's secret.

    Made at each try, the same each time (the link expires with the draft's review)."""
    if payload.get("type") != REVIEW_REQUESTED or link_secret is None:
        return payload
    data, draft = payload["data"], payload["data"]["draft"]
    expires = int(dt.datetime.fromisoformat(draft["review_until"]).timestamp())
    decide = links.review_link(link_secret, data["id"], draft["id"], expires)
    return {**payload, "data": {**data, "links": {**data["links"], "decide": decide}}}


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """A signature: `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body`."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return f"v1,{base64.b64encode(mac).decode()}"


def signatures(secrets: Sequence[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header: a signature with each secret, space-separated (a rotation's overlap)."""
    return " ".join(sign(secret, message_id, timestamp, body) for secret in secrets)


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
class Outcome:
    status_code: int | None = None
    error: str | None = None
    blocked: bool = False

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class Sender:
    """POSTs a signed notice through the guarded client, each try within `deadline_s` as a whole.

    Connections are not kept: a receiver gets one notice now and then, not a stream of them."""

    def __init__(self, allow_private: bool, timeout_s: float, transport: Any = None) -> None:
        self._timeout_s = timeout_s
        self.deadline_s = 2 * timeout_s + 5  # the name's lookup, the connection, the answer: shorter than a lease
        self._client = outbound.Client(
            allow_private=allow_private, timeout_s=timeout_s, keepalive=False, transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def send(self, message_id: str, url: str, body: bytes, secrets: Sequence[str]) -> Outcome:
        """One try, signed with each of `secrets`.

        A receiver (or its name server) slower than the deadline is a failed try: the call is left to end by its
        own timeouts while the deliverer goes on.
        """
        watch = cancellation.Cancellation()
        timer = threading.Timer(self.deadline_s, watch.cancel, args=(cancellation.Reason.TIMEOUT,))
        timer.start()
        try:
            return watch.call(lambda: self._send(message_id, url, body, secrets))
        except cancellation.Cancelled:
            return Outcome(error=f"no answer within {self.deadline_s:g} s")
        finally:
            timer.cancel()

    def _send(self, message_id: str, url: str, body: bytes, secrets: Sequence[str]) -> Outcome:
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": "castad-webhooks",
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signatures(secrets, message_id, timestamp, body),
        }
        deadline = time.monotonic() + self._timeout_s  # for the whole exchange, the answer's headers too
        try:
            with self._client.stream("POST", url, content=body, headers=headers, deadline=deadline) as response:
                status = response.status_code
                # The answer's status is what counts: a body too large or encoded is not read on.
                with contextlib.suppress(outbound.TooLarge, outbound.EncodingRefused):
                    outbound.read(response, ANSWER_MAX_BYTES, deadline)
        except outbound.Refused as error:  # a destination no try can send to
            log.warning("notice %s not sent: %s", message_id, error)
            return Outcome(error=REFUSED, blocked=True)
        except (httpx.HTTPError, OSError) as error:
            return Outcome(error=redact.describe(error))
        if 300 <= status < 400:
            return Outcome(status_code=status, error=f"answered {status}: redirects are not followed")
        return Outcome(status_code=status)


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
                payload = with_decide_link(delivery.payload, self.config.link_secret)
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
        query = (
            sa.select(webhook_deliveries, pipelines.c.tenant)
            .outerjoin(pipelines, pipelines.c.id == webhook_deliveries.c.pipeline_id)
            .where(webhook_deliveries.c.status == "pending", webhook_deliveries.c.due_at <= sa.func.now())
            .order_by(webhook_deliveries.c.due_at)
            .limit(free)
            .with_for_update(of=webhook_deliveries, skip_locked=True)
        )
        full = self.slots.full_hosts()
        if full:  # a notice made before its host was kept (migration 0015) is read once claimed
            query = query.where(webhook_deliveries.c.host.is_(None) | webhook_deliveries.c.host.not_in(full))
        rows = conn.execute(query).all()
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
            conn.execute(
                webhook_deliveries.update()
                .where(webhook_deliveries.c.id.in_(spent))
                .values(
                    status="failed", finished_at=sa.func.now(), last_error="no answer was recorded for its last try"
                )
            )
        if taken:
            lease = dt.timedelta(seconds=2 * self.config.webhook_timeout_s + 30)
            conn.execute(
                webhook_deliveries.update()
                .where(webhook_deliveries.c.id.in_([delivery.id for delivery, _ in taken]))
                .values(attempts=webhook_deliveries.c.attempts + 1, due_at=sa.func.now() + lease)
            )
        # More may be due when the claim was cut at its limit; not when it took nothing (it would find the same).
        return len(rows) == free and bool(taken or spent)

    def _record(self, conn: sa.Connection, delivery: Due, outcome: Outcome, started: dt.datetime, ms: int) -> None:
        error = outcome.error or (None if outcome.delivered else f"answered {outcome.status_code}")
        conn.execute(
            pg_insert(webhook_attempts)
            .on_conflict_do_nothing()  # a replica that took the notice over after its lease recorded this try
            .values(
                delivery_id=delivery.id,
                number=delivery.attempts,
                started_at=started,
                duration_ms=ms,
                status_code=outcome.status_code,
                error=error and error[:ERROR_MAX_CHARS],
            )
        )
        values: dict[str, Any] = {"last_error": error and error[:ERROR_MAX_CHARS]}
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
        # Only while the notice is still ours: pending at this try's count (a replica that took it over after the
        # lease, or a later try, decides otherwise).
        mine = (
            (webhook_deliveries.c.id == delivery.id)
            & (webhook_deliveries.c.status == "pending")
            & (webhook_deliveries.c.attempts == delivery.attempts)
        )
        conn.execute(webhook_deliveries.update().where(mine).values(**values))

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


@dataclasses.dataclass(frozen=True)
class Try:
    """A try of a notice: the receiver's answer (`status_code`), or the error that stood for one."""

    number: int
    started_at: dt.datetime
    duration_ms: int
    status_code: int | None
    error: str | None


@dataclasses.dataclass(frozen=True)
class Delivery:
    """A notice of a pipeline's end, with its tries so far."""

    id: uuid.UUID
    url: str
    event_type: str
    status: str  # pending, delivered, failed
    attempts: int
    due_at: dt.datetime
    last_error: str | None
    created_at: dt.datetime
    finished_at: dt.datetime | None
    tries: tuple[Try, ...]


def deliveries(conn: sa.Connection, pipeline_id: uuid.UUID) -> list[Delivery]:
    """The notices of a pipeline, oldest first, each with its tries."""
    d, a = webhook_deliveries, webhook_attempts
    columns = [d.c[field.name] for field in dataclasses.fields(Delivery) if field.name != "tries"]
    rows = conn.execute(sa.select(*columns).where(d.c.pipeline_id == pipeline_id).order_by(d.c.created_at))
    result = []
    for row in rows:
        tried = sa.select(*(a.c[field.name] for field in dataclasses.fields(Try)))
        tries = conn.execute(tried.where(a.c.delivery_id == row.id).order_by(a.c.number))
        result.append(Delivery(**row._asdict(), tries=tuple(Try(**t._asdict()) for t in tries)))
    return result
