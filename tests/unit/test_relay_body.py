"""The relay's message body, and the row it judges.

The outbox row's envelope as stored, parsed by the relay (`publisher.taken_apart`): its type and source are read
from the very fields it publishes, with the publish span's trace context in place of the stored one.
"""

from __future__ import annotations

import json

import pytest
from castad_relay import publisher

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    "envelope",
    [
        {},
        {"id": "e1", "data": {"brief": '바다책방 "quoted" }', "tags": ["a", "}"]}},
        {"specversion": "1.0", "data": {}, "traceparent": "00-stored-01", "tracestate": "stored=1"},
    ],
    ids=["empty", "nested-and-escaped", "with-a-stored-trace"],
)
@pytest.mark.parametrize("tracestate", [None, "vendor=1"])
def test_the_body_is_the_envelope_with_the_new_trace_context(envelope, tracestate):
    row = publisher.taken_apart({"envelope": envelope})

    body = publisher.envelope_body(row["envelope"], TRACEPARENT, tracestate)

    fields = {name: value for name, value in envelope.items() if name not in publisher.TRACE_FIELDS}
    assert json.loads(body) == {**fields, "traceparent": TRACEPARENT, "tracestate": tracestate}
    assert "\\u" not in body.decode()  # UTF-8 as it is, not escaped


def test_the_type_and_source_judged_are_the_published_ones_and_a_stored_trace_context_is_kept_for_the_span():
    stored = {"type": "lyric.started", "source": "/castad/lyric", "traceparent": "00-stored-01", "data": {}}

    row = publisher.taken_apart({"envelope": stored, "routing_key": "lyric.started"})

    assert (row["event_type"], row["event_source"], row["traceparent"], row["tracestate"]) == (
        "lyric.started",
        "/castad/lyric",
        "00-stored-01",
        None,
    )
    assert json.loads(publisher.envelope_body(row["envelope"], None, None))["type"] == row["event_type"]


@pytest.mark.parametrize("stored", [["lyric.started"], "lyric.started", {"type": 1, "source": ["/castad/lyric"]}])
def test_an_envelope_that_is_no_object_or_names_no_text_type_has_none_to_judge(stored):
    row = publisher.taken_apart({"envelope": stored})

    assert (row["event_type"], row["event_source"]) == (None, None)
    assert json.loads(publisher.envelope_body(row["envelope"], None, None)) is not None  # the operators' notice
