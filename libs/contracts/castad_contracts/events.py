"""Typed payloads of every event Castad publishes, and their registry.

Event types are past-tense facts. A payload is self-contained: a consumer never
calls the producer to do its work. Each type carries a schema version; when a
payload changes shape, add a new model under a new version and keep the old one
registered so that events still sitting in a queue stay consumable.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from castad_contracts import brief as brief_


class Stage(enum.StrEnum):
    LYRIC = "lyric"
    SONG = "song"
    VIDEO = "video"


STAGE_ORDER: tuple[Stage, ...] = (Stage.LYRIC, Stage.SONG, Stage.VIDEO)


# The gateway names pipelines by str(uuid.uuid4()); an event about anything else is refused
# when it is read, so that it is dead-lettered at once instead of failing its handler.
PipelineId = Annotated[
    str,
    Field(
        pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
        description="the pipeline id, a lowercase UUID",
    ),
]


class Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pipeline_id: PipelineId


class Artifact(BaseModel):
    """A file a stage produced, referenced by location and content hash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str = Field(description="file:// URI of the artifact")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0, description="size in bytes")
    media_type: str


class LyricSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["verse", "chorus", "bridge"]
    lines: tuple[str, ...]


class Lyrics(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str
    language: brief_.Language
    sections: tuple[LyricSection, ...]

    def lines(self) -> list[str]:
        return [line for section in self.sections for line in section.lines]


class TimedLine(BaseModel):
    """A lyric line and when it is sung."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    start_s: float = Field(ge=0)
    end_s: float = Field(ge=0)


class PipelineRequested(Payload):
    brief: brief_.Brief
    requested_at: dt.datetime
    max_attempts: dict[Stage, int] | None = Field(
        default=None, description="Per-stage override of the configured maximum attempts."
    )


class StageStarted(Payload):
    stage: Stage
    job_id: str
    attempt: int = Field(ge=1)
    started_at: dt.datetime


class StageRetrying(Payload):
    stage: Stage
    job_id: str
    attempt: int = Field(ge=1, description="the attempt that failed")
    max_attempts: int
    error_code: str
    error_message: str
    next_attempt_at: dt.datetime


class StageFailed(Payload):
    stage: Stage
    job_id: str
    attempt: int
    error_code: str
    error_message: str
    failed_at: dt.datetime


class StageCompleted(Payload):
    stage: Stage
    job_id: str
    attempt: int
    artifact: Artifact
    completed_at: dt.datetime
    brief: brief_.Brief
    max_attempts: dict[Stage, int] | None = None


class LyricCompleted(StageCompleted):
    lyrics: Lyrics


class SongCompleted(StageCompleted):
    lyrics: Lyrics
    timed_lines: tuple[TimedLine, ...]
    song_duration_s: float


class VideoCompleted(StageCompleted):
    width: int
    height: int


class PipelineCancelRequested(Payload):
    reason: str = ""


class PipelineRetryRequested(Payload):
    stage: Stage


PIPELINE_REQUESTED = "pipeline.requested"
PIPELINE_CANCEL_REQUESTED = "pipeline.cancel_requested"
PIPELINE_RETRY_REQUESTED = "pipeline.retry_requested"


def stage_event(stage: Stage, fact: Literal["started", "retrying", "completed", "failed"]) -> str:
    return f"{stage.value}.{fact}"


_COMPLETED: dict[Stage, type[Payload]] = {
    Stage.LYRIC: LyricCompleted,
    Stage.SONG: SongCompleted,
    Stage.VIDEO: VideoCompleted,
}

# (event type, schema version) -> payload model. Never remove an entry.
REGISTRY: dict[tuple[str, int], type[Payload]] = {
    (PIPELINE_REQUESTED, 1): PipelineRequested,
    (PIPELINE_CANCEL_REQUESTED, 1): PipelineCancelRequested,
    (PIPELINE_RETRY_REQUESTED, 1): PipelineRetryRequested,
}
for _stage in Stage:
    REGISTRY[(stage_event(_stage, "started"), 1)] = StageStarted
    REGISTRY[(stage_event(_stage, "retrying"), 1)] = StageRetrying
    REGISTRY[(stage_event(_stage, "completed"), 1)] = _COMPLETED[_stage]
    REGISTRY[(stage_event(_stage, "failed"), 1)] = StageFailed

CURRENT_VERSION: dict[str, int] = {}
for _type, _version in REGISTRY:
    CURRENT_VERSION[_type] = max(_version, CURRENT_VERSION.get(_type, 0))

EVENT_TYPES: tuple[str, ...] = tuple(sorted(CURRENT_VERSION))


class UnknownEventType(LookupError):
    """No payload model is registered for this event type and version."""


def payload_model(event_type: str, version: int) -> type[Payload]:
    try:
        return REGISTRY[(event_type, version)]
    except KeyError:
        raise UnknownEventType(f"no payload model for {event_type!r} version {version}") from None
