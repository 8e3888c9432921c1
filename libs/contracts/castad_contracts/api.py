"""Request and response bodies of the gateway's REST API (a pipeline's request body is `PipelineRequest`)."""

from __future__ import annotations

import datetime as dt
import urllib.parse
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from castad_contracts import brief, events


class Links(BaseModel):
    self: str
    events: str
    cancel: str
    retry: str


class PipelineAccepted(BaseModel):
    id: str
    status: str
    created: bool = Field(description="false when the Idempotency-Key had already been used for this body")
    links: Links


class ArtifactLink(BaseModel):
    """A stage's file as clients see it: where to fetch it, never where the servers keep it."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0, description="size in bytes")
    media_type: str
    download: str = Field(description="the gateway's path that serves the file (an API key with `read`)")

    @classmethod
    def of(cls, pipeline_id: str, stage: events.Stage, artifact: dict[str, Any]) -> ArtifactLink:
        return cls(
            sha256=artifact["sha256"],
            size=artifact["size"],
            media_type=artifact["media_type"],
            download=f"/v1/pipelines/{pipeline_id}/artifacts/{stage.value}",
        )


class StageView(BaseModel):
    stage: events.Stage
    status: str
    attempts: int
    max_attempts: int | None
    last_error_code: str | None
    last_error_message: str | None
    next_attempt_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    artifact: ArtifactLink | None


class PipelineView(BaseModel):
    id: str
    status: str
    progress: int = Field(ge=0, le=100)
    current_stage: events.Stage | None
    error_code: str | None
    error_message: str | None
    brief: brief.Brief
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    cancel_requested_at: dt.datetime | None = Field(description="set while a cancel is pending or decided it")
    cancel_reason: str | None
    retries: int = Field(description="operator retries so far")
    deadline_at: dt.datetime | None = Field(description="canceled (deadline_exceeded) if not ended by then")
    stages: list[StageView]
    links: Links


class PipelinePage(BaseModel):
    items: list[PipelineView]
    next_cursor: str | None = Field(description="pass as `cursor` to get the next page; null on the last page")


class Problem(BaseModel):
    detail: str


def http_url(value: str) -> str:
    """An absolute http(s) URL with a host, a valid port and no credentials."""
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError("must be an absolute http or https URL")
    if parsed.username is not None or parsed.password is not None:
        raise ValueError("must not carry credentials")
    try:
        parsed.port  # noqa: B018 (raises ValueError for a port that is not one)
    except ValueError:
        raise ValueError("has a port that is not a number from 0 to 65535") from None
    return value


CallbackUrl = Annotated[str, StringConstraints(strip_whitespace=True, max_length=2000), AfterValidator(http_url)]


class PipelineRequest(brief.Brief):
    """A brief, and where to tell of its pipeline's end. Only the brief travels to the stages."""

    callback_url: CallbackUrl | None = Field(
        default=None,
        description="Where to POST a signed notice (Standard Webhooks) when the pipeline ends.",
        examples=["https://example.com/hooks/castad"],
    )

    def without_callback(self) -> brief.Brief:
        """The brief alone, as the stages get it."""
        return brief.Brief.model_validate(self.model_dump(exclude={"callback_url"}))


class WebhookTry(BaseModel):
    number: int
    started_at: dt.datetime
    duration_ms: int
    status_code: int | None = Field(description="the receiver's answer; null when there was none")
    error: str | None


class WebhookDelivery(BaseModel):
    """A notice to the brief's callback_url that the pipeline ended, and every try of it."""

    id: str = Field(description="its webhook-id header, the same on every try")
    url: str
    event_type: str = Field(description="pipeline.succeeded, pipeline.failed or pipeline.canceled")
    status: str = Field(description="pending, delivered or failed")
    attempts: int
    due_at: dt.datetime = Field(description="when pending: when it is tried next")
    last_error: str | None
    created_at: dt.datetime
    finished_at: dt.datetime | None
    tries: list[WebhookTry]


Reason = Annotated[str, StringConstraints(min_length=1, max_length=500), AfterValidator(brief.no_control_characters)]
Filter = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(brief.no_control_characters)]


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"reason": "the customer withdrew"}]})

    reason: Reason = "canceled by an operator"


class RetryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{}, {"max_attempts": {"song": 8}}]})

    max_attempts: dict[events.Stage, Annotated[int, Field(ge=1, le=100)]] | None = Field(
        default=None, description="attempt budget per stage for this retry (default: each stage's setting)"
    )


class ActionAccepted(BaseModel):
    """A cancel or retry recorded: the stages carry it out; the pipeline's status and event stream follow."""

    id: str
    status: str = Field(description="the pipeline's status now (CANCELING after a cancel, RUNNING after a retry)")
    operation: int | None = Field(description="the request's number; null when a cancel had been asked already")
    resumes_at: events.Stage | None = Field(default=None, description="after a retry: the stage that runs again")
    links: Links


class Conflict(BaseModel):
    detail: str
    status: str = Field(description="the state that does not allow the action")


class DeadLetterAction(BaseModel):
    action: str
    actor: str
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
