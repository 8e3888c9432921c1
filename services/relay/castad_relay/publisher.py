"""Publishing outbox rows on a confirm-mode channel, with an answer per row.

Pipelines go out concurrently, each pipeline's rows in order and one at a time: a row is
sent once the one before it is confirmed, and none after one that was not, so a consumer
never gets a pipeline's row before an earlier one. Each row comes back as one of:
- PUBLISHED: the broker confirmed it, routed;
- Refused: the broker will not take this row for the row's own sake (no queue bound to its
  routing key, too large): the relay backs it off and eventually parks it; or (`final`) the
  relay itself will not send it (its outbox may not publish it, `ownership`): parked at once;
- SUSPECT: its channel was closed while it was in flight for a reason that may be the row's
  (a precondition it failed, such as the broker's size limit; a replay's destination that does
  not exist or may not be written); the closing may be its fault or another row's, so the relay
  tries it again alone before blaming it;
- HELD_BACK: not sent, because an earlier row of its pipeline was not published;
- QueueMissing: not sent, because a queue that must take it does not exist yet (`bindings`): it
  waits, uncharged, until the queue's service or set-up declares it;
- readers.Unread: not sent, because no replica of a service that takes it reads its version yet
  (`readers`): it waits, uncharged, until one runs;
- pushback.PushedBack: nacked by the broker (a queue that takes it is full, or without a majority
  of its nodes), or not sent because its destination refuses publishes now (`pushback`): it
  waits, uncharged, while one row probes the destination now and then;
- None: lost to trouble with the broker, which is nobody's fault: a lost or stalled connection,
  or a channel closed for the broker's own reasons. It waits, uncharged, and the relay pauses
  before trying again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import aiormq
from castad_contracts import envelope as envelope_
from castad_contracts import topology
from castad_runtime import redact, telemetry
from opentelemetry import trace
from pamqp import commands as spec
from prometheus_client import Histogram

from castad_relay import bindings as bindings_
from castad_relay import connection, pushback, readers

log = logging.getLogger(__name__)


class Sent(enum.Enum):
    PUBLISHED = "published"
    SUSPECT = "suspect"
    HELD_BACK = "held back"  # not sent: an earlier row of its pipeline was not published


@dataclasses.dataclass(frozen=True)
class Refused:
    reason: str
    final: bool = False  # never to be sent, whatever the broker says: parked at once


@dataclasses.dataclass(frozen=True)
class QueueMissing:
    queue: str  # the queue it waits for

    def reason(self) -> str:
        return f"waits for queue {self.queue}, which must take it and does not exist yet"


RowResult = Sent | Refused | QueueMissing | readers.Unread | pushback.PushedBack | None
Waiting = (QueueMissing, readers.Unread, pushback.PushedBack)  # held, uncharged, until what it waits for is there

# Channel closes that may be the row's own doing: a failed precondition (over the broker's size limit),
# and, for a row sent to a replay's destination, a missing or forbidden exchange. Any other close, and any
# of these on the events exchange itself, is the broker's or the set-up's trouble, not the row's.
ROWS_OWN_CLOSES = (aiormq.exceptions.ChannelPreconditionFailed,)
DESTINATIONS_OWN_CLOSES = (aiormq.exceptions.ChannelNotFoundEntity, aiormq.exceptions.ChannelAccessRefused)
# What trouble with the broker raises on the way (a connection lost, stalled or refused): nobody's fault.
BROKER_TROUBLE = (TimeoutError, aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError, OSError)


def stopping() -> bool:
    """Whether the current task itself is being cancelled (a stop).

    Rather than handed a CancelledError by a library whose connection died.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


TRACE_FIELDS = ("traceparent", "tracestate")


def taken_apart(row: dict[str, Any]) -> dict[str, Any]:
    """An outbox row as the relay judges and publishes it.

    Its envelope (as stored, parsed here) without the trace context that the relay's publish span replaces, that
    context apart, and the envelope's `event_type` and `event_source` (None where it names none) for `ownership`:
    what is judged is what is sent; and its `schema_version`, for `readers`.
    """
    stored = row["envelope"]
    fields = stored if isinstance(stored, dict) else {}
    for name in TRACE_FIELDS:
        row[name] = _text(fields.get(name))
    if isinstance(stored, dict):
        row["envelope"] = {name: value for name, value in stored.items() if name not in TRACE_FIELDS}
    row["event_type"], row["event_source"] = _text(fields.get("type")), _text(fields.get("source"))
    version = fields.get("schemaversion", 1)
    row["schema_version"] = version if isinstance(version, int) and not isinstance(version, bool) else 1
    return row


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def envelope_body(envelope: Any, traceparent: str | None, tracestate: str | None) -> bytes:
    """A message body: an outbox row's envelope (`taken_apart`) with the given trace context."""
    if isinstance(envelope, dict):
        envelope = {**envelope, "traceparent": traceparent, "tracestate": tracestate}
    return json.dumps(envelope, ensure_ascii=False).encode()


class Publisher:
    """A confirm-mode channel on one connection, reopened after any failure."""

    def __init__(
        self,
        amqp_url: str,
        exchange: str,
        confirm_timeout_s: float,
        max_message_bytes: int,
        confirms: Histogram | None = None,
        bindings: bindings_.Bindings | None = None,
        readers_: readers.Readers | None = None,
        push_back: pushback.PushBack | None = None,
    ) -> None:
        self.amqp_url = amqp_url
        self.bindings = bindings  # None: published without binding the queues that take each type first
        self.readers = readers_  # None: published without asking whether a consumer reads the event's version
        self.push_back = push_back or pushback.PushBack(first_s=1.0)  # the destinations that refuse publishes now
        self.confirms = confirms  # seconds from a row's publish to its confirm
        self.exchange = exchange
        self.confirm_timeout_s = confirm_timeout_s
        self.max_message_bytes = max_message_bytes
        self._connection: aiormq.abc.AbstractConnection | None = None
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._lock = asyncio.Lock()
        self._tracer = telemetry.tracer("castad.relay")
        self.closes: dict[int, str] = {}  # row id -> why the broker closed the channel it was SUSPECT on

    async def channel(self) -> aiormq.abc.AbstractChannel:
        async with self._lock:
            if self._channel is None or self._channel.is_closed:
                await self.close()
                if self.bindings is not None:
                    self.bindings.forget()
                self._connection = await connection.connect(self.amqp_url, timeout_s=self.confirm_timeout_s)
                # A node that answers the connection but not the channel (a partition) must not hold the relay.
                async with asyncio.timeout(self.confirm_timeout_s):
                    self._channel = await self._connection.channel(publisher_confirms=True)
            return self._channel

    async def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    async def publish(
        self,
        rows: Sequence[dict[str, Any]],
        may_publish: Callable[[], bool] = lambda: True,
        refusal: Callable[[dict[str, Any]], str | None] = lambda row: None,
    ) -> list[RowResult]:
        """Publish a batch (see the module docstring); the result of each row, in row order.

        `may_publish` is asked before each row is sent: once it says no (the relay lost its lease), nothing
        more is sent and the rows left are None, as lost to trouble. `refusal` says why a row may not be sent
        at all (None: it may): such a row is Refused for good, unsent, and holds back its pipeline's later rows."""
        channel = await self.channel()
        results: list[RowResult] = [None] * len(rows)
        by_pipeline: defaultdict[str, list[int]] = defaultdict(list)
        for index, row in enumerate(rows):
            by_pipeline[row["pipeline_id"]].append(index)
        trouble: list[BaseException] = []

        async def in_order(indexes: list[int]) -> None:
            for position, index in enumerate(indexes):
                if not may_publish():
                    return
                refused = refusal(rows[index])
                if refused is not None:
                    results[index] = Refused(refused, final=True)
                else:
                    results[index] = await self._routed_and_sent(channel, rows[index], trouble, may_publish)
                if results[index] is not Sent.PUBLISHED:
                    for later in indexes[position + 1 :]:
                        results[later] = Sent.HELD_BACK
                    return

        await asyncio.gather(*(in_order(indexes) for indexes in by_pipeline.values()))
        if trouble:
            log.warning(
                "%d of %d publishes lost to broker trouble: %s", len(trouble), len(rows), redact.describe(trouble[0])
            )
        if trouble or any(r is Sent.SUSPECT for r in results):
            await self.close()  # the channel may be broken; a nack (pushed back) leaves it as it was
        return results

    async def publish_dead_letter(self, exchange: str, body: bytes, headers: dict[str, Any], message_id: str) -> bool:
        """Put a copy in the dead-letter queue (through its exchange); True once the broker confirmed it."""
        try:
            channel = await self.channel()
            answer = await channel.basic_publish(
                body,
                exchange=exchange,
                routing_key="",
                properties=spec.Basic.Properties(delivery_mode=2, message_id=message_id, headers=headers),
                mandatory=True,
                timeout=self.confirm_timeout_s,
            )
        except aiormq.exceptions.DeliveryError as error:  # nacked (full) or returned: the channel is as it was
            log.warning("the dead-letter queue did not take the notice of a parked row: %s", redact.describe(error))
            return False
        except BROKER_TROUBLE as error:
            log.warning("could not tell the dead-letter queue about a parked row: %s", redact.describe(error))
            await self.close()
            return False
        return isinstance(answer, spec.Basic.Ack)

    async def _routed_and_sent(
        self,
        channel: aiormq.abc.AbstractChannel,
        row: dict[str, Any],
        trouble: list[BaseException],
        may_publish: Callable[[], bool],
    ) -> RowResult:
        """The row published once its queues are bound and read it.

        Every queue that must take it is bound to its type (`bindings`), and a replica of each service taking it reads
        its version (`readers`). A replay goes to its one queue, which the broker checks itself
        (`DESTINATIONS_OWN_CLOSES`)."""
        if self.bindings is not None and not row.get("destination"):
            try:
                queue = await self.bindings.missing(channel.connection, row["routing_key"])
            except BROKER_TROUBLE as error:
                trouble.append(error)
                return None
            if queue is not None:
                return QueueMissing(queue)
        if self.readers is not None and not row.get("destination") and row["event_type"] is not None:
            unread = await self.readers.unread(row["event_type"], row.get("schema_version", 1))
            if unread is not None:
                return unread
        if not may_publish():  # the looks above may have taken a while: the lease is asked again
            return None
        destination = row.get("destination") or row["event_type"]
        held = self.push_back.hold(destination)
        if held is not None:
            return held
        try:
            result = await self._publish_one(channel, row, destination, trouble)
        except BaseException:
            self.push_back.lost(destination)  # a probe that raised must not hold its destination for ever
            raise
        if result is Sent.PUBLISHED:
            self.push_back.taken(destination)
        elif not isinstance(result, pushback.PushedBack):
            self.push_back.lost(destination)
        return result

    async def _publish_one(
        self, channel: aiormq.abc.AbstractChannel, row: dict[str, Any], routing_key: str, trouble: list[BaseException]
    ) -> RowResult:
        """Publish a row with `routing_key`: a replayed dead letter's queue, or its type (judged by `ownership`)."""
        parent = telemetry.context_from(row["traceparent"], row["tracestate"])
        # A replayed dead letter goes back to its queue only, through that queue's requeue exchange.
        destination = row.get("destination")
        exchange = topology.Topology.requeue_exchange(destination) if destination else self.exchange
        with self._tracer.start_span(  # not made current: nothing else here would be its child
            f"publish {exchange}",  # OpenTelemetry messaging: "{operation} {destination}"
            context=parent,
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.operation.name": "publish",
                "messaging.operation.type": "send",
                "messaging.destination.name": exchange,
                "messaging.rabbitmq.destination.routing_key": routing_key,
                "messaging.message.id": str(row["event_id"]),
                "castad.pipeline_id": row["pipeline_id"],
            },
        ) as span:
            # The consumer continues the trace from this publish span.
            traceparent, tracestate = telemetry.current_trace_headers(span)
            body = envelope_body(row["envelope"], traceparent, tracestate)
            if len(body) > self.max_message_bytes:
                return Refused(f"message of {len(body)} bytes is over the {self.max_message_bytes} byte limit")
            headers: dict[str, Any] = {k: v for k, v in (("traceparent", traceparent), ("tracestate", tracestate)) if v}
            properties = spec.Basic.Properties(
                content_type=envelope_.CONTENT_TYPE,
                delivery_mode=2,  # persistent
                message_id=str(row["event_id"]),
                message_type=row["event_type"],
                timestamp=row["created_at"],
                headers=headers,
            )
            sent_at = time.perf_counter()
            try:
                answer = await channel.basic_publish(
                    body,
                    exchange=exchange,
                    routing_key=routing_key,
                    properties=properties,
                    mandatory=True,
                    timeout=self.confirm_timeout_s,
                )
            except aiormq.exceptions.PublishError as error:
                text = error.frame.reply_text if isinstance(error.frame, spec.Basic.Return) else "returned"
                return Refused(f"returned by the broker: {text}")
            except aiormq.exceptions.DeliveryError:  # a nack (aiormq raises it rather than return the Basic.Nack)
                return self.push_back.refused(routing_key)
            except aiormq.exceptions.ChannelClosed as error:
                with trace.use_span(span):  # the log line carries the pipeline's trace id
                    log.warning("channel closed while publishing %s: %s", row["event_id"], redact.describe(error))
                if isinstance(error, ROWS_OWN_CLOSES) or (destination and isinstance(error, DESTINATIONS_OWN_CLOSES)):
                    self.closes[row["id"]] = redact.describe(error)
                    return Sent.SUSPECT
                trouble.append(error)
                return None
            except BROKER_TROUBLE as error:
                trouble.append(error)
                return None
            except asyncio.CancelledError as error:
                if stopping():
                    raise
                # aiormq rejects the confirms it still awaits with a CancelledError when its connection dies.
                trouble.append(error)
                return None
            if self.confirms is not None:
                self.confirms.observe(time.perf_counter() - sent_at)
            if isinstance(answer, spec.Basic.Nack):  # what a nack is, should aiormq return it
                return self.push_back.refused(routing_key)
            return Sent.PUBLISHED
