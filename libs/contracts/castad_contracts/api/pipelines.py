"""A pipeline: its request body, as read and listed, remade, canceled and retried, and its notices."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator

from castad_contracts import brief, events
from castad_contracts.api.common import Links, Reason
from castad_contracts.api.files import ArtifactLink, CaptionLink, FetchedPhotoLink, FormatLink
from castad_contracts.api.reviews import ReviewView


class PipelineAccepted(BaseModel):
    id: str
    status: str
    created: bool = Field(description="false when the Idempotency-Key had already been used for this body")
    links: Links


class StageView(BaseModel):
    stage: events.Stage
    status: str
    attempts: int
    max_attempts: int | None
    last_error_code: str | None
    last_error_message: str | None = Field(description="to a tenant: its code's public message")
    next_attempt_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    artifact: ArtifactLink | None
    fetched_photos: list[FetchedPhotoLink] = Field(
        default_factory=list,
        description="with its artifact, the photos the brief names by URL as the stage fetched and kept them (the"
        " video stage, rendering locally), in the brief's order",
    )
    poster: ArtifactLink | None = Field(
        default=None,
        description="with its artifact, a still of the video (JPEG) showing the business's name over the first photo"
        " (the video stage; null when its renderer made none)",
    )
    captions: list[CaptionLink] = Field(
        default_factory=list,
        description="with its artifact, the sung lines as caption files timed as they are sung (the song stage)",
    )
    formats: list[FormatLink] = Field(
        default_factory=list,
        description="with its artifact, the video in each format the brief asked for, the first the artifact itself"
        " (the video stage; empty for a video recorded by a gateway of a release before formats)",
    )
    reused_from: str | None = Field(
        default=None,
        description="a remake's stage before the one it made again: the remade pipeline, whose file it copied"
        " (no provider was asked)",
    )


# A pipeline's statuses once it ended (PipelineView.status); only an operator's retry moves it on again.
ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELED"})


class PipelineView(BaseModel):
    id: str
    status: str
    progress: int = Field(ge=0, le=100)
    current_stage: events.Stage | None
    error_code: str | None
    error_message: str | None = Field(description="to a tenant: its code's public message")
    brief: brief.Brief
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    cancel_requested_at: dt.datetime | None = Field(description="set while a cancel is pending or decided it")
    cancel_reason: str | None
    retries: int = Field(description="operator retries so far")
    deadline_at: dt.datetime | None = Field(
        description="canceled (deadline_exceeded) if not ended by then; it stands still while a draft waits for a"
        " person (AWAITING_REVIEW), and moves on by as long"
    )
    review: ReviewView | None = Field(default=None, description="the review the brief asked for (null: none)")
    remake_of: RemakeLink | None = Field(
        default=None, description="the pipeline this one remakes, and from which stage (null: not a remake)"
    )
    remakes: list[str] = Field(default_factory=list, description="the pipelines that remake this one, oldest first")
    stages: list[StageView]
    links: Links


class PipelinePage(BaseModel):
    items: list[PipelineView]
    next_cursor: str | None = Field(description="pass as `cursor` to get the next page; null on the last page")


http_url = brief.http_url

CallbackUrl = Annotated[str, StringConstraints(strip_whitespace=True, max_length=2000), AfterValidator(http_url)]


def distinct(ids: list[str]) -> list[str]:
    if len(set(ids)) != len(ids):
        raise ValueError("names the same photo more than once")
    return ids


def image_id_or_url(value: str) -> str:
    """An upload's image id (a lowercase UUID) or a photo's http(s) URL."""
    if re.fullmatch(brief.UUID_PATTERN, value):
        return value
    if "://" not in value:
        raise ValueError("must be an uploaded image's id (a lowercase UUID) or an https URL")
    return brief.http_url(value)


PhotoName = Annotated[
    str,
    StringConstraints(strip_whitespace=True, max_length=brief.PHOTO_URL_MAX_LENGTH),
    AfterValidator(image_id_or_url),
]


class PipelineRequest(brief.BriefV2):
    """A brief, the photos it shows by the ids their uploads got, and where to tell of its pipeline's end.

    The stages get the brief with each photo as a reference (id, sha256, media type, size); the callback URL
    stays with the gateway."""

    photos: Annotated[list[PhotoName], AfterValidator(distinct)] = Field(
        default_factory=list,
        max_length=brief.MAX_PHOTOS,
        description=f"Up to {brief.MAX_PHOTOS} photos of the business in the order to show them, each the id of an"
        " image uploaded first (POST /v1/images) by a key of the same tenant, or an https URL the video stage"
        " fetches when it renders.",
        examples=[["0d7f3c4e-1a2b-4c3d-8e9f-0a1b2c3d4e5f", "https://example.com/photos/hall.jpg"]],
    )
    callback_url: CallbackUrl | None = Field(
        default=None,
        description="Where to POST a signed notice (Standard Webhooks) when the pipeline ends.",
        examples=["https://example.com/hooks/castad"],
    )
    orientation: brief.Orientation | None = Field(  # type: ignore[assignment]
        default=None,
        description="vertical (9:16, for shorts) or horizontal (16:9); default: the first format's, else vertical.",
    )
    formats: brief.Formats = Field(
        default=(),
        max_length=len(brief.Format),
        exclude_if=lambda formats: not formats,  # a request without them as a gateway of a release before reads it
        description="The formats to make of the video, each from the one song and laid out for its frame: 9:16,"
        " 1:1, 16:9 (default: the orientation's). The first is the video's own file.",
        examples=[["9:16", "1:1", "16:9"]],
    )

    review: brief.Review | None = Field(
        default=None,
        description="Ask a person to approve, edit or regenerate the lyrics before the song is paid for"
        " (POST /v1/pipelines/{id}/review); null: the pipeline runs straight through.",
        examples=[{"lyrics": True, "timeout_s": 86400, "on_timeout": "cancel"}],
    )
    brand: Literal["tenant", "none"] = Field(
        default="tenant",
        exclude_if=lambda brand: brand == "tenant",  # as formats
        description="tenant: the tenant's brand kit (PUT /v1/brand) as it is now, if it has one; none: no kit.",
    )

    @field_validator("formats")
    @classmethod
    def _agree_with_orientation(cls, formats: tuple[brief.Format, ...], info: ValidationInfo) -> Any:
        """An orientation given with formats must be the first format's (1:1 has none)."""
        orientation = info.data.get("orientation")
        said = brief.FORMAT_ORIENTATION.get(formats[0]) if formats else None
        if None not in (orientation, said) and said != orientation:
            raise ValueError(f"begin with {formats[0]}, which is {said}, but orientation is {orientation}: give one")
        return formats

    def for_stages(
        self, photos: tuple[brief.Photo | brief.PhotoLink, ...], brand: brief.Brand | None = None
    ) -> brief.Brief:
        """The brief as the stages get it: the photos named by reference, its `brand`, without the callback URL."""
        fields = self.model_dump(exclude={"callback_url", "photos", "brand", "review"}, exclude_none=True)
        return brief.Brief.model_validate({**fields, "photos": photos, "brand": brand})


# What a remake may change, by the first stage it makes again: the song's genre, and what the video shows.
SONG_CHANGES = frozenset({"genre"})
VIDEO_CHANGES = frozenset({"orientation", "formats", "photos", "brand"})


class RemakeChanges(BaseModel):
    """What a remake changes of the brief; what it does not name stays as the remade pipeline had it."""

    model_config = ConfigDict(extra="forbid")

    genre: brief.GenreText | None = Field(default=None, description="the song's genre (a remake from song)")
    orientation: brief.Orientation | None = Field(default=None, description="the video's orientation")
    formats: brief.Formats | None = Field(default=None, max_length=len(brief.Format), description="the video's formats")
    photos: Annotated[list[PhotoName], AfterValidator(distinct)] | None = Field(
        default=None, max_length=brief.MAX_PHOTOS, description="the photos to show instead, as a brief names them"
    )
    brand: Literal["tenant", "none"] | None = Field(
        default=None,
        description="tenant: the tenant's brand kit as it is now; none: no kit (default: the remade pipeline's kit)",
    )


class RemakeRequest(BaseModel):
    """Make a finished pipeline again from one stage on, with changes; the stages before reuse their files."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: Literal["song", "video"] = Field(
        alias="from",
        description="the first stage made again: song (a new song and video of the same lyrics) or video (a new"
        " video of the same song)",
    )
    changes: RemakeChanges = Field(default_factory=RemakeChanges)
    callback_url: CallbackUrl | None = Field(default=None, description="where to POST a notice when the remake ends")

    @field_validator("changes")
    @classmethod
    def _made_again(cls, changes: RemakeChanges, info: ValidationInfo) -> RemakeChanges:
        """A remake from video keeps the song: it may change only what the video shows."""
        allowed = VIDEO_CHANGES | (SONG_CHANGES if info.data.get("from_") == "song" else frozenset())
        refused = sorted(name for name in changes.model_fields_set if name not in allowed)
        if refused:
            raise ValueError(f"a remake from {info.data.get('from_')} keeps the song: it cannot change {refused[0]}")
        return changes


class RemakeLink(BaseModel):
    id: str = Field(description="the pipeline remade")
    from_: events.Stage = Field(alias="from", description="the first stage made again; the ones before reused")
    links: Links

    model_config = ConfigDict(populate_by_name=True)


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
