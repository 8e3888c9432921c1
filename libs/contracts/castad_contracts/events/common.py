"""What every event's payload is built of: the stages, the pipeline's id, files, remakes and shares."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


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


def artifact_place(pipeline_id: str, stage: Stage) -> str:
    """How the name of every file a stage keeps for a pipeline starts, under the store's root or prefix.

    Each stage keeps its files in a place of its own, `<stage>/`, that a deployment lets that stage alone write
    (lyric.completed from v6, song.completed and video.completed from v7). Up to the versions before, a stage kept
    them in the pipeline's folder, `<pipeline id>/<stage>-…`, where any stage that could write one could write all.
    """
    return f"{stage.value}/{pipeline_id}/{stage.value}-"


def in_stage_place(uri: str, pipeline_id: str, stage: Stage) -> bool:
    """Whether the file at `uri` is one the stage keeps for the pipeline in its own place (`artifact_place`)."""
    path = uri.split("?", 1)[0].split("#", 1)[0]
    place = f"/{artifact_place(pipeline_id, stage)}"
    return place in path and "/" not in path.rsplit(place, 1)[1]


class Artifact(BaseModel):
    """A file a stage produced, referenced by location and content hash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str = Field(description="file:// URI of the artifact")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0, description="size in bytes")
    media_type: str


class Remake(BaseModel):
    """A pipeline made again from `stage` on, with changes, of the pipeline `of`: the stages before reuse its output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    of: PipelineId
    stage: Stage = Field(description="the first stage made again; each one before it copies its own output of `of`")


REMAKE = Field(
    default=None,
    exclude_if=lambda remake: remake is None,  # as a brief's formats: one without it reads as before remakes
    description="the pipeline this one remakes, and from which stage (None: not a remake)",
)


MAX_SHARE_WEIGHT = 100


class Share(BaseModel):
    """Whose work a pipeline is, as the stages share their provider's turns out: fairly across tenants, by weight.

    Each stage takes the jobs that wait for its workers or its provider's quota in turn across tenants, so that a
    tenant's backlog never holds another's work back for more than a turn or two; within a tenant, oldest first
    (castad_runtime.stage.fair). Told by the gateway with the brief, and passed on by each stage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str = Field(min_length=1, description="the tenant whose key made the pipeline")
    weight: int = Field(
        default=1, ge=1, le=MAX_SHARE_WEIGHT, description="turns the tenant gets for another's one, both waiting"
    )


SHARE = Field(
    default=None,
    exclude_if=lambda share: share is None,  # as a remake: an event without it reads as one of a release before
    description="whose work it is, and its weight, for the stages' fair turns (None: a release before told none)",
)
PROVIDER_CALLS = Field(
    default=None,
    ge=1,
    exclude_if=lambda calls: calls is None,
    description="requests for work this attempt sent its provider since its last event said (each a task the"
    " provider bills; looking up how work goes is not one); null: none, or a release before metering",
)
