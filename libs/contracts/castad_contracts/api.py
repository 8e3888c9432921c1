"""Response bodies of the gateway's REST API (the request body is `brief.Brief`)."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field

from castad_contracts import brief, events


class Links(BaseModel):
    self: str
    events: str


class PipelineAccepted(BaseModel):
    id: str
    status: str
    created: bool = Field(description="false when the Idempotency-Key had already been used for this body")
    links: Links


class ArtifactLink(events.Artifact):
    download: str = Field(description="gateway URL that serves the file")


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
    stages: list[StageView]
    links: Links


class PipelinePage(BaseModel):
    items: list[PipelineView]
    next_cursor: str | None = Field(description="pass as `cursor` to get the next page; null on the last page")


class Problem(BaseModel):
    detail: str
