"""From a relay-published envelope to a Dramatiq message: the shared mapping."""

from __future__ import annotations

import base64
import json

import pytest
from castad_contracts import envelope, events
from castad_runtime import messaging

ENCODER = messaging.EnvelopeEncoder("t.song", "song.on_event")


def published(**changes: object) -> bytes:
    document = envelope.Envelope(source="/castad/lyric", type="lyric.started", subject="p-1", data={}).model_dump(
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
    assert message["actor_name"] == messaging.DEAD_LETTER_ACTOR
    kept, why = message["args"]
    assert base64.b64decode(kept) == raw
    assert why.startswith(reason)


def test_dramatiqs_own_messages_keep_their_form():
    own = {"queue_name": "t.song", "actor_name": "song.on_event", "args": [], "message_id": "m-1", "kwargs": {}}
    assert ENCODER.decode(ENCODER.encode(own)) == own


def test_an_unknown_event_type_is_still_a_valid_envelope_for_the_consumer_to_refuse():
    message = ENCODER.decode(published(type="song.exploded"))
    assert message["actor_name"] == "song.on_event"
    with pytest.raises(events.UnknownEventType):
        envelope.Envelope.model_validate(message["args"][0]).payload()
