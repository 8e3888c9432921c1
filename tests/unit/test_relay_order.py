"""Per-pipeline order in the relay.

How a batch goes out on the wire, and which confirmed rows it may mark published. Publishing runs against a fake
confirm-mode channel; the integration tests run it against RabbitMQ.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import aiormq
import pytest
from castad_relay import publisher as publisher_
from castad_relay import pushback, relay
from pamqp import commands as spec
from pamqp import header

CREATED = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


def rows(*pipelines: str) -> list[dict[str, Any]]:
    """Outbox rows as the relay reads them, ids 1..n, of the given pipelines in that order."""
    return [
        {
            "id": index,
            "event_id": index,
            "pipeline_id": pipeline,
            "routing_key": "stage.lyric.started",
            "event_type": "stage.lyric.started",
            "envelope": {},
            "traceparent": None,
            "tracestate": None,
            "created_at": CREATED,
        }
        for index, pipeline in enumerate(pipelines, start=1)
    ]


def unroutable() -> aiormq.exceptions.PublishError:
    """What aiormq raises when the broker returns a mandatory message it could not route."""
    returned = spec.Basic.Return(reply_code=312, reply_text="NO_ROUTE", exchange="castad", routing_key="nowhere")
    message = aiormq.abc.DeliveredMessage(returned, header.ContentHeader(), b"", channel=None)  # type: ignore[arg-type]
    return aiormq.exceptions.PublishError(message, returned)


def nacked() -> aiormq.exceptions.DeliveryError:
    """What aiormq raises when the broker nacks a publish."""
    return aiormq.exceptions.DeliveryError(None, spec.Basic.Nack())


class FakeChannel:
    """A confirm-mode channel that answers each publish after a round trip.

    Other publishes may go out meanwhile. The answer is an ack, or what `answers` says for that row id. It records
    when each row was sent and answered.
    """

    is_closed = False

    def __init__(self, answers: dict[int, object] | None = None) -> None:
        self.answers = answers or {}
        self.events: list[tuple[str, int]] = []

    async def basic_publish(self, body: bytes, *, properties: spec.Basic.Properties, **_: object) -> object:
        row_id = int(properties.message_id or "")
        self.events.append(("sent", row_id))
        await asyncio.sleep(0)
        self.events.append(("answered", row_id))
        answer = self.answers.get(row_id, spec.Basic.Ack())
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def sent(self) -> list[int]:
        return [row_id for event, row_id in self.events if event == "sent"]


PUBLISHED = publisher_.Sent.PUBLISHED
SUSPECT = publisher_.Sent.SUSPECT
HELD_BACK = publisher_.Sent.HELD_BACK


def publish(
    batch: list[dict[str, Any]], channel: FakeChannel, max_message_bytes: int = 1 << 20
) -> tuple[list[publisher_.RowResult], publisher_.Publisher]:
    publisher = publisher_.Publisher("amqp://never-connected", "castad", 1, max_message_bytes)
    publisher._channel = channel  # an open channel: publish uses it instead of connecting
    return asyncio.run(publisher.publish(batch)), publisher


def channel_closed() -> aiormq.exceptions.ChannelClosed:
    return aiormq.exceptions.ChannelPreconditionFailed("PRECONDITION_FAILED - message size exceeds max")


def broker_closed() -> aiormq.exceptions.ChannelClosed:
    """A channel the broker closed for reasons of its own (an internal error while a node goes down)."""
    return aiormq.exceptions.ChannelClosed(541, "INTERNAL_ERROR")


def not_found() -> aiormq.exceptions.ChannelClosed:
    return aiormq.exceptions.ChannelNotFoundEntity("NOT_FOUND - no exchange 'castad.lyric.requeue'")


def test_every_confirmed_row_is_published():
    assert relay.publishable(rows("a", "b", "a"), [PUBLISHED] * 3) == [1, 2, 3]


def test_a_rejected_row_holds_back_the_later_rows_of_its_pipeline_only():
    batch = rows("a", "b", "a", "b", "c")
    results = [publisher_.Refused("nacked"), PUBLISHED, PUBLISHED, PUBLISHED, PUBLISHED]
    assert relay.publishable(batch, results) == [2, 4, 5]


def test_earlier_rows_of_a_pipeline_stay_published_when_a_later_one_fails():
    assert relay.publishable(rows("a", "a", "a"), [PUBLISHED, None, HELD_BACK]) == [1]


def test_a_pipelines_rows_are_sent_one_at_a_time_each_once_the_one_before_is_confirmed():
    channel = FakeChannel()
    results, _ = publish(rows("a", "a", "a"), channel)

    assert results == [PUBLISHED] * 3
    assert channel.events == [(event, row_id) for row_id in (1, 2, 3) for event in ("sent", "answered")]


def test_different_pipelines_are_sent_without_waiting_for_each_other():
    channel = FakeChannel()
    results, _ = publish(rows("a", "b", "c", "a"), channel)

    assert results == [PUBLISHED] * 4
    assert channel.events[:3] == [("sent", 1), ("sent", 2), ("sent", 3)]


@pytest.mark.parametrize(
    ("answer", "result"),
    [
        (unroutable(), publisher_.Refused("returned by the broker: NO_ROUTE")),
        (TimeoutError(), None),
        (channel_closed(), SUSPECT),
        (broker_closed(), None),
    ],
    ids=["unroutable", "timed-out", "channel-closed", "closed-by-the-broker-itself"],
)
def test_no_later_row_of_a_pipeline_is_sent_after_one_that_was_not_confirmed(answer: object, result: object):
    channel = FakeChannel({1: answer})
    batch = rows("a", "b", "a", "b", "a")
    results, _ = publish(batch, channel)

    assert sorted(channel.sent()) == [1, 2, 4]
    assert results == [result, PUBLISHED, HELD_BACK, PUBLISHED, HELD_BACK]
    assert relay.publishable(batch, results) == [2, 4]


@pytest.mark.parametrize("nack", [nacked(), spec.Basic.Nack()], ids=["raised", "returned"])
def test_a_nacked_row_holds_its_pipeline_and_every_row_for_its_destination(nack: object):
    """A nack is its destination's (a queue full, or without a majority), not the row's: it pushes back."""
    channel = FakeChannel({1: nack})
    batch = rows("a", "b", "a", "b", "a")
    batch[1]["event_type"] = batch[1]["routing_key"] = "stage.song.started"  # another destination
    results, _ = publish(batch, channel)

    assert sorted(channel.sent()) == [1, 2]  # pipeline b's first row went out beside it, its second waits
    refused, held = results[0], results[3]
    assert isinstance(refused, pushback.PushedBack) and refused.sent
    assert isinstance(held, pushback.PushedBack) and not held.sent
    assert [results[1], results[2], results[4]] == [PUBLISHED, HELD_BACK, HELD_BACK]
    assert relay.publishable(batch, results) == [2]


@pytest.mark.parametrize(
    ("answer", "closes"),
    [
        (nacked(), False),
        (spec.Basic.Nack(), False),
        (unroutable(), False),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (channel_closed(), True),
        (broker_closed(), True),
    ],
    ids=["nacked", "nack-returned", "unroutable", "timed-out", "connection-lost", "channel-closed", "closed-by-broker"],
)
def test_only_a_failure_that_may_have_broken_the_channel_closes_it(answer: object, closes: bool):
    channel = FakeChannel({2: answer})
    results, publisher = publish(rows("a", "b"), channel)

    assert results[0] is PUBLISHED and results[1] is not PUBLISHED
    assert (publisher._channel is None) == closes


def test_a_row_over_the_size_limit_is_refused_without_being_sent():
    channel = FakeChannel()
    batch = rows("a", "b")
    batch[0]["envelope"] = {"data": "x" * 5000}

    results, _ = publish(batch, channel, max_message_bytes=4096)

    assert channel.sent() == [2]
    assert isinstance(results[0], publisher_.Refused) and "over the 4096 byte limit" in results[0].reason
    assert results[1] is PUBLISHED


def test_a_missing_exchange_is_the_rows_doing_only_for_a_replay_sent_to_its_own_destination():
    """A replay names its destination queue (through that queue's requeue exchange).

    If that exchange is missing, the row is to blame. The events exchange missing is the set-up's trouble: every
    row waits.
    """
    replay, event = rows("a", "b")
    replay["destination"] = "castad.lyric"
    results, _ = publish([replay, event], FakeChannel({1: not_found(), 2: not_found()}))

    assert results == [SUSPECT, None]


def test_once_the_relay_may_not_publish_no_further_row_is_sent():
    """A relay that lost its lease mid-batch (it froze, another took over) sends nothing more."""
    channel = FakeChannel()
    publisher = publisher_.Publisher("amqp://never-connected", "castad", 1, 1 << 20)
    publisher._channel = channel

    results = asyncio.run(publisher.publish(rows("a", "a", "a"), lambda: len(channel.sent()) < 2))  # lost after two

    assert channel.sent() == [1, 2]
    assert results == [PUBLISHED, PUBLISHED, None]
    assert relay.publishable(rows("a", "a", "a"), results) == [1, 2]


class MissingQueue:
    """Bindings that find the queue of one routing key missing, and count their looks."""

    def __init__(self, routing_key: str, queue: str) -> None:
        self.routing_key, self.queue = routing_key, queue
        self.looks: list[str] = []

    async def missing(self, connection: object, routing_key: str) -> str | None:
        self.looks.append(routing_key)
        return self.queue if routing_key == self.routing_key else None


def test_a_row_a_missing_queue_must_take_waits_unsent_and_holds_back_only_its_pipeline():
    channel = FakeChannel()
    channel.connection = object()
    batch = rows("a", "b", "a")
    batch[0]["routing_key"] = batch[0]["event_type"] = "lyric.completed"
    bindings = MissingQueue("lyric.completed", "castad.song")
    publisher = publisher_.Publisher("amqp://never-connected", "castad", 1, 1 << 20, bindings=bindings)  # type: ignore[arg-type]
    publisher._channel = channel

    results = asyncio.run(publisher.publish(batch))

    assert results == [publisher_.QueueMissing("castad.song"), PUBLISHED, HELD_BACK]
    assert channel.sent() == [2]
    assert relay.publishable(batch, results) == [2]


def test_a_replay_goes_to_its_one_queue_without_a_look_at_the_others():
    channel = FakeChannel()
    channel.connection = object()
    [replay] = rows("a")
    replay |= {"routing_key": "lyric.completed", "event_type": "lyric.completed", "destination": "castad.api"}
    bindings = MissingQueue("lyric.completed", "castad.song")
    publisher = publisher_.Publisher("amqp://never-connected", "castad", 1, 1 << 20, bindings=bindings)  # type: ignore[arg-type]
    publisher._channel = channel

    assert asyncio.run(publisher.publish([replay])) == [PUBLISHED]
    assert bindings.looks == []
