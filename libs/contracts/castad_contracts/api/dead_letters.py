"""Dead letters as an operator lists, reads, replays and discards them."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from castad_contracts.api.common import Filter, Reason


class DeadLetterAction(BaseModel):
    action: str
    actor: str = Field(description="who acted, as the X-Castad-Actor header said")
    key_id: str | None = Field(default=None, description="the API key that acted (null: recorded before keys were)")
    key_name: str | None = Field(default=None, description="that key's name")
    detail: str
    at: dt.datetime


class DeadLetter(BaseModel):
    id: int
    kind: str = Field(
        description="message: a queue could not handle it; parked: an outbox row the broker refused;"
        " unrecordable: a message recorded bare (its headers could not be stored)"
    )
    status: str = Field(description="dead, replayed or discarded")
    service: str | None
    queue: str | None
    reason: str
    event_id: str | None
    event_type: str | None
    schema_version: int | None
    pipeline_id: str | None
    received_at: dt.datetime
    replays: int
    body_size: int


class DeadLetterDetail(DeadLetter):
    headers: dict[str, Any]
    body: str = Field(description="as received: text if it is UTF-8, else base64 (see body_encoding); capped")
    body_encoding: str = Field(description="utf-8 or base64")
    body_truncated: bool
    actions: list[DeadLetterAction]


class DeadLetterPage(BaseModel):
    items: list[DeadLetter]
    next_cursor: str | None


class DeadLetterFilter(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"service": "lyric", "event_type": "pipeline.requested", "limit": 50}]},
    )

    service: Filter | None = None
    event_type: Filter | None = None
    reason: Filter | None = Field(default=None, description="a part of the reason")
    pipeline_id: Filter | None = None
    limit: int = Field(default=100, ge=1, le=1000)


class Discard(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"reason": "a test message"}]})

    reason: Reason


class Replayed(BaseModel):
    id: int
    detail: str


class BulkReplayed(BaseModel):
    replayed: list[int]
    refused: dict[int, str] = Field(description="dead letters not replayed, and why")
