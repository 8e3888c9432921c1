"""The envelope every event travels in: CloudEvents 1.0 attribute names.

`subject` is the pipeline id, `schemaversion` (a CloudEvents extension attribute)
selects the payload model, and `traceparent`/`tracestate` carry the W3C trace
context so that one pipeline is one trace.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from castad_contracts import events, ids

CONTENT_TYPE = "application/cloudevents+json"


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    specversion: Literal["1.0"] = "1.0"
    # Time-ordered (version 7): it keys the outbox's and the inbox's indexes, which grow at the event rate.
    id: uuid.UUID = Field(default_factory=ids.time_ordered)
    source: str = Field(description="the producing service, e.g. /castad/lyric")
    type: str = Field(description="event type, also the routing key")
    subject: events.PipelineId
    time: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.UTC))
    datacontenttype: Literal["application/json"] = "application/json"
    schemaversion: int = Field(default=1, ge=1)
    traceparent: str | None = None
    tracestate: str | None = None
    data: dict[str, object]

    def payload(self, registry: events.Registry = events.REGISTRY) -> events.Payload:
        """The typed payload, as the newest model the registry knows (older versions are upcast).

        Raises UnknownEventType, NewerSchemaVersion or pydantic.ValidationError.
        """
        return registry.read(self.type, self.schemaversion, self.data)

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> Envelope:
        return cls.model_validate_json(raw)


def wrap(
    payload: events.Payload,
    event_type: str,
    source: str,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> Envelope:
    """Put a payload of the current model of its type in a new envelope, as the oldest version that carries it whole.

    So that a consumer of an earlier release, during a rolling upgrade, reads every event it can represent
    (`events.Registry.oldest_carrying`), and holds only one that needs a version it does not know yet."""
    current = events.REGISTRY.current_version(event_type)
    expected = events.REGISTRY.model(event_type, current)
    if not isinstance(payload, expected):
        raise TypeError(f"{event_type} v{current} carries {expected.__name__}, not {type(payload).__name__}")
    version, data = events.REGISTRY.oldest_carrying(event_type, payload)
    return Envelope(
        source=source,
        type=event_type,
        subject=payload.pipeline_id,
        schemaversion=version,
        traceparent=traceparent,
        tracestate=tracestate,
        data=data,
    )
