"""From a relay-published envelope to a Dramatiq message: the shared mapping."""

from __future__ import annotations

import base64
import json
from typing import Any

import dramatiq
import pika.exceptions
import pytest
from castad_contracts import envelope, events
from castad_runtime import encoder, messaging

ENCODER = encoder.EnvelopeEncoder("t.song", "song.on_event")
PIPELINE = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"


def published(**changes: object) -> bytes:
    document = envelope.Envelope(source="/castad/lyric", type="lyric.started", subject=PIPELINE, data={}).model_dump(
        mode="json"
    )
    document.update(changes)
    return json.dumps(document).encode()


def test_an_envelope_becomes_a_message_for_the_services_event_actor():
    raw = published()
    message = ENCODER.decode(raw)
    assert message["actor_name"] == "song.on_event"
    assert message["queue_name"] == "t.song"
    assert message["args"] == [json.loads(raw)]
    assert message["message_id"] == json.loads(raw)["id"]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"hello": "world"}', "neither a CloudEvents envelope nor a Dramatiq message"),
        (published(subject=None), "invalid envelope: subject"),
        (published(specversion="0.3"), "invalid envelope: specversion"),
    ],
)
def test_anything_else_goes_to_the_dead_letter_actor_with_its_reason(raw, reason):
    message = ENCODER.decode(raw)
    assert message["actor_name"] == encoder.DEAD_LETTER_ACTOR
    kept, why = message["args"]
    assert base64.b64decode(kept) == raw
    assert why.startswith(reason)


@pytest.mark.parametrize("routing_key", ["lyric.started", "t.song", None])
def test_an_envelope_delivered_under_its_own_type_or_to_this_queue_alone_goes_to_the_event_actor(routing_key):
    """Its type from the events exchange, or this queue's name: a replay the gateway sent back to it alone.

    (None: decoded outside a consumer, which knows no routing key.)"""
    encoder.delivering(routing_key)
    try:
        assert ENCODER.decode(published())["actor_name"] == "song.on_event"
    finally:
        encoder.delivering(None)


def test_an_envelope_delivered_under_another_types_routing_key_is_a_dead_letter():
    """A body that says video.completed, routed as lyric.started: whatever it says of itself, it came another way."""
    raw = published(type="video.completed", source="/castad/video")
    encoder.delivering("lyric.started")
    try:
        message = ENCODER.decode(raw)
    finally:
        encoder.delivering(None)

    assert message["actor_name"] == encoder.DEAD_LETTER_ACTOR
    kept, why = message["args"]
    assert base64.b64decode(kept) == raw and why == "a video.completed delivered under routing key 'lyric.started'"


def own_message(**changes: object) -> dict[str, Any]:
    """A retry as Dramatiq enqueues it for the event actor (as JSON has it: lists, not tuples)."""
    message = dramatiq.Message(
        queue_name="t.song",
        actor_name="song.on_event",
        args=[json.loads(published())],
        kwargs={},
        options={"retries": 1, "traceback": "..."},
    ).asdict()
    message.update(changes)
    return json.loads(json.dumps(message))


@pytest.mark.parametrize(
    "own",
    [
        own_message(),
        own_message(queue_name="t.song.DQ", options={"eta": 1}),
        own_message(actor_name=encoder.DEAD_LETTER_ACTOR, args=["aGk=", "why"]),
    ],
)
def test_dramatiqs_own_messages_keep_their_form(own):
    assert ENCODER.decode(ENCODER.encode(own)) == own


@pytest.mark.parametrize(
    ("own", "reason"),
    [
        (own_message(args=5), "invalid Dramatiq message: args"),
        ({k: v for k, v in own_message().items() if k != "options"}, "invalid Dramatiq message: options"),
        (own_message(queue_name="t.video"), "a Dramatiq message for queue 't.video'"),
        (own_message(actor_name="video.on_event"), "a Dramatiq message for unknown actor 'video.on_event'"),
        (own_message(args=[]), "a Dramatiq message with bad arguments for song.on_event"),
        (own_message(kwargs={"x": 1}), "a Dramatiq message with bad arguments"),
    ],
)
def test_a_dramatiq_message_the_queue_cannot_run_is_dead_lettered(own, reason):
    raw = ENCODER.encode(own)
    message = ENCODER.decode(raw)
    assert message["actor_name"] == encoder.DEAD_LETTER_ACTOR
    kept, why = message["args"]
    assert base64.b64decode(kept) == raw
    assert why.startswith(reason)
    assert message["queue_name"] == "t.song"


def test_a_bad_message_from_the_delay_queue_is_dead_lettered_on_the_delay_queue():
    """Dramatiq acknowledges a message through the consumer of the queue it names.

    Naming the main queue would leave the delivery on the delay queue unacknowledged, to come back later.
    """
    message = ENCODER.decode(ENCODER.encode(own_message(queue_name="t.song.DQ", args=[])))
    assert (message["actor_name"], message["queue_name"]) == (encoder.DEAD_LETTER_ACTOR, "t.song.DQ")


def test_an_unknown_event_type_is_still_a_valid_envelope_for_the_consumer_to_refuse():
    message = ENCODER.decode(published(type="song.exploded"))
    assert message["actor_name"] == "song.on_event"
    with pytest.raises(events.UnknownEventType):
        envelope.Envelope.model_validate(message["args"][0]).payload()


class RefusingChannel:
    """A confirm-mode pika channel whose queue `full` refuses every publish (nacked), as one at its length limit."""

    def __init__(self, full: str) -> None:
        self.full = full
        self.published: list[tuple[str, str]] = []

    def basic_publish(self, exchange: str, routing_key: str, body: bytes, **_: object) -> None:
        if routing_key == self.full:
            raise pika.exceptions.NackError([])
        self.published.append((exchange, routing_key))


def test_a_message_its_full_queue_refuses_goes_to_its_delay_queue_instead(monkeypatch):
    """Dramatiq moving a due message from the delay queue to a full queue: nothing dropped, no delivery counted."""
    monkeypatch.setattr(messaging, "FULL_QUEUE_PAUSE_S", 0.0)
    channel = messaging._RequeueChannel(RefusingChannel("castad.song"), "castad.song.requeue")

    channel.basic_publish("", "castad.song", b"{}")

    assert channel._channel.published == [("castad.song.requeue", "castad.song.DQ")]
    with pytest.raises(pika.exceptions.NackError):  # the delay queue itself refusing it, or another exchange: raised
        messaging._RequeueChannel(RefusingChannel("castad.song.DQ"), "castad.song.requeue").basic_publish(
            "", "castad.song.DQ", b"{}"
        )
