"""How the gateway records a dead-letter message: what it can read of it, nothing PostgreSQL would refuse."""

from __future__ import annotations

import base64
import json
import types
import uuid

from castad_api import dead_letter_recorder, dead_letter_rows
from castad_runtime import consumer


def test_an_event_dead_letter_is_described_by_its_envelope_and_headers():
    event_id, pipeline_id = uuid.uuid4(), str(uuid.uuid4())
    body = json.dumps(
        {"specversion": "1.0", "id": str(event_id), "type": "lyric.started", "subject": pipeline_id, "schemaversion": 2}
    ).encode()
    headers = {"x-castad-reason": "no handler", "x-castad-service": "api", "x-castad-queue": "castad.api"}

    row = dead_letter_rows.describe("m-1", headers, body, body_max=1024)

    assert (row["message_id"], row["kind"], row["service"], row["queue"], row["reason"]) == (
        "m-1",
        "message",
        "api",
        "castad.api",
        "no handler",
    )
    assert (row["event_id"], row["event_type"], row["schema_version"], row["pipeline_id"]) == (
        event_id,
        "lyric.started",
        2,
        pipeline_id,
    )
    assert (row["body"], row["body_size"]) == (body, len(body))


def test_nul_characters_never_reach_a_text_column_and_the_body_keeps_every_byte():
    body = b'{"type": "a\\u0000b", "\\u0000k": 1}\x00'
    headers = {"x-castad-reason": "\x00k: Extra inputs are not permitted", "x-\x00": ["\x00"]}

    row = dead_letter_rows.describe(None, headers, body, body_max=1024)

    text = json.dumps({key: value for key, value in row.items() if key != "body"}, default=str)
    assert "\\u0000" not in text
    assert row["reason"] == "k: Extra inputs are not permitted"
    assert row["body"] == body  # not JSON (the trailing NUL): recorded as received


def test_a_message_without_an_id_gets_the_same_one_each_time_it_comes():
    first = dead_letter_rows.describe(None, {"x-castad-reason": "r"}, b"garbage", body_max=1024)
    again = dead_letter_rows.describe(None, {"x-castad-reason": "r"}, b"garbage", body_max=1024)
    other = dead_letter_rows.describe(None, {"x-castad-reason": "r"}, b"other garbage", body_max=1024)

    assert first["message_id"] == again["message_id"] != other["message_id"]
    assert first["message_id"].startswith("sha256:")


def test_a_parked_row_notice_and_a_body_over_the_cap():
    row = dead_letter_rows.describe(
        "p", {dead_letter_rows.PARKED_HEADER: str(uuid.uuid4())}, b"x" * 5000, body_max=1024
    )
    assert (row["kind"], row["body_size"], len(row["body"]), row["reason"]) == ("parked", 5000, 1024, "no reason given")


def test_a_message_its_queue_gave_up_on_is_described_by_the_brokers_x_death():
    """A message its queue gave up on is described by the broker's `x-death`.

    A message taken and never acknowledged past the delivery limit carries no header of Castad's, only the broker's
    `x-death`: the row says why in words, and which service's queue it came from.
    """
    event_id = uuid.uuid4()
    body = json.dumps({"specversion": "1.0", "id": str(event_id), "type": "pipeline.requested"}).encode()
    headers = {"x-death": [{"count": 1, "reason": "delivery_limit", "queue": "castad.lyric", "exchange": ""}]}

    row = dead_letter_rows.describe(str(event_id), headers, body, body_max=1024)

    assert (row["service"], row["queue"], row["event_type"]) == ("lyric", "castad.lyric", "pipeline.requested")
    assert row["reason"].startswith("taken more than 20 times and never acknowledged")


def test_a_retry_its_delay_queue_gave_up_on_is_described_by_the_event_inside_and_goes_back_to_the_main_queue():
    event_id, pipeline_id = uuid.uuid4(), str(uuid.uuid4())
    envelope = {"specversion": "1.0", "id": str(event_id), "type": "song.started", "subject": pipeline_id}
    body = json.dumps({"actor_name": "api.on_event", "queue_name": "castad.api.DQ", "args": [envelope]}).encode()
    headers = {"x-death": [{"count": 1, "reason": "delivery_limit", "queue": "castad.api.DQ", "exchange": ""}]}

    row = dead_letter_rows.describe(None, headers, body, body_max=1024)

    assert (row["service"], row["queue"]) == ("api", "castad.api")
    assert (row["event_id"], row["event_type"], row["pipeline_id"]) == (event_id, "song.started", pipeline_id)


def test_a_dead_letter_that_cannot_be_read_is_described_bare_rather_than_left_in_the_queue(monkeypatch):
    """Reading a message must never fail for good.

    A letter that made `describe` raise would come back to the recorder at every reconnect, holding up the queue
    behind it (and, on RabbitMQ 4, be dropped at its limit).
    """

    def broken(*_: object) -> dict[str, object]:
        raise KeyError("a bug")

    monkeypatch.setattr(dead_letter_rows, "describe", broken)
    recorder = dead_letter_recorder.Recorder("amqp://never-connected", "castad.dead-letter", engine=None, body_max=4)  # type: ignore[arg-type]
    properties = types.SimpleNamespace(message_id=None, headers={"x": 1})

    row = recorder._described(properties, b"abcdefgh")

    assert row["kind"] == "unrecordable" and "KeyError" in row["reason"]
    assert (row["body"], row["body_size"]) == (b"abcd", 8) and row["message_id"].startswith("sha256:")


def filed(queue: str, body: bytes, reason: str, count: int = 1) -> tuple[dict[str, object], bytes]:
    """A dead letter a consumer filed.

    Its message, with the reason, rejected on its own queue, which the broker dead-lettered with an `x-death`
    naming that queue.
    """
    message = {
        "queue_name": queue,
        "actor_name": "castad.dead_letter",
        "args": [base64.b64encode(body).decode(), reason],
        "kwargs": {},
        "options": {"castad_filed": True},
        "message_id": consumer.filed_id(queue, body),
        "message_timestamp": 0,
    }
    return {"x-death": [{"count": count, "reason": "rejected", "queue": queue, "exchange": ""}]}, json.dumps(
        message
    ).encode()


def test_a_dead_letter_a_consumer_filed_is_its_own_message_with_its_reason_from_the_queue_it_died_in():
    event_id = uuid.uuid4()
    original = json.dumps({"specversion": "1.0", "id": str(event_id), "type": "lyric.completed"}).encode()
    headers, body = filed("castad.song", original, "lyric.completed handler failed 21 times")

    row = dead_letter_rows.describe(None, headers, body, body_max=1024)

    assert (row["kind"], row["service"], row["queue"]) == ("message", "song", "castad.song")
    assert row["reason"] == "lyric.completed handler failed 21 times"
    assert (row["body"], row["body_size"], row["event_id"]) == (original, len(original), event_id)


def test_a_message_filed_twice_is_one_letter_of_its_queue_alone():
    """A message filed twice is one letter of its queue alone.

    A consumer stopped after it filed a message but before it acknowledged it files it again when the message comes
    back: the two letters die apart (their `x-death` differs) but are one row.
    """
    garbage = b"\x00\xff poison {not json"
    first = dead_letter_rows.describe(None, *filed("castad.video", garbage, "not JSON"), body_max=1024)
    again = dead_letter_rows.describe(None, *filed("castad.video", garbage, "not JSON", count=2), body_max=1024)
    elsewhere = dead_letter_rows.describe(None, *filed("castad.song", garbage, "not JSON"), body_max=1024)

    assert first["message_id"] == again["message_id"]
    assert elsewhere["message_id"] != first["message_id"]


def test_the_queue_a_letter_died_in_is_the_brokers_word_not_what_its_headers_claim():
    """The queue a letter died in is the broker's newest `x-death` entry, whatever its headers claim.

    Whatever a service puts in a message of its own queue (headers naming another queue or service, a parked row's
    header, a forged `x-death` of its own), the broker's entry says where it died: that is the queue it is replayed
    into.
    """
    original = json.dumps({"specversion": "1.0", "id": str(uuid.uuid4()), "type": "lyric.completed"}).encode()
    headers, body = filed("castad.lyric", original, "no handler")
    headers["x-death"] = [*headers["x-death"], {"count": 1, "reason": "rejected", "queue": "castad.song"}]  # type: ignore[list-item]
    forged = {
        **headers,
        "x-castad-queue": "castad.song",
        "x-castad-service": "song",
        "x-first-death-queue": "castad.song",
        dead_letter_rows.PARKED_HEADER: str(uuid.uuid4()),
    }

    row = dead_letter_rows.describe(None, forged, body, body_max=1024)

    assert (row["kind"], row["service"], row["queue"]) == ("message", "lyric", "castad.lyric")
