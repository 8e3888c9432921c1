"""The relay's message body.

The outbox row's envelope, read as JSON text without its trace context, with the publish span's trace context
spliced in.
"""

from __future__ import annotations

import json

import pytest
from castad_relay import publisher


@pytest.mark.parametrize(
    "envelope",
    [
        {},
        {"id": "e1", "data": {"brief": '바다책방 "quoted" }', "tags": ["a", "}"]}},
        {"specversion": "1.0", "data": {}},
    ],
    ids=["empty", "nested-and-escaped", "plain"],
)
@pytest.mark.parametrize("tracestate", [None, "vendor=1"])
def test_the_body_is_the_envelope_with_the_new_trace_context(envelope, tracestate):
    content = json.dumps(envelope)  # PostgreSQL's text of a JSONB object has the same shape: {"k": v, ...}
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    body = json.loads(publisher.envelope_body(content, traceparent, tracestate))

    assert body == {**envelope, "traceparent": traceparent, "tracestate": tracestate}
