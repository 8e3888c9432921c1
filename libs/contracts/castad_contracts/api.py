"""Request and response bodies of the gateway's REST API (a pipeline's request body is `PipelineRequest`)."""

from __future__ import annotations

import datetime as dt
import enum
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator

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
    def of(cls, pipeline_id: str, stage: events.Stage, artifact: dict[str, Any], file: str = "") -> ArtifactLink:
        """The link of the stage's artifact, or of its other `file` (`poster`, `formats/1x1`)."""
        return cls(
            sha256=artifact["sha256"],
            size=artifact["size"],
            media_type=artifact["media_type"],
            download=f"/v1/pipelines/{pipeline_id}/artifacts/{stage.value}" + (f"/{file}" if file else ""),
        )


class FetchedPhotoLink(BaseModel):
    """A photo the brief names by URL as the video stage fetched and kept it.

    A file of that stage, fetched from the gateway as the stage's artifact is, never from where the servers keep it.
    """

    photo: int = Field(ge=0, description="its place in the brief's photos, from 0")
    url: str = Field(description="the URL the brief names it by")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="of the kept file (cleaned: not of what was fetched)")
    size: int = Field(ge=0, description="size in bytes of the kept file")
    media_type: str
    width: int | None = Field(description="in pixels, upright; null when the stage did not say")
    height: int | None = Field(description="in pixels, upright; null when the stage did not say")
    download: str = Field(description="the gateway's path that serves the file (an API key with `read`)")

    @classmethod
    def of(cls, pipeline_id: str, fetched: dict[str, Any]) -> FetchedPhotoLink:
        told = events.FetchedPhoto.model_validate(fetched)
        return cls(
            photo=told.photo,
            url=told.url,
            sha256=told.file.sha256,
            size=told.file.size,
            media_type=told.file.media_type,
            width=told.width,
            height=told.height,
            download=f"/v1/pipelines/{pipeline_id}/artifacts/{events.Stage.VIDEO.value}/photos/{told.photo}",
        )


# The formats as path segments of the gateway's links (brief.Format.slug): 9x16, 1x1, 16x9.
FORMAT_SLUG_PATTERN = "^(" + "|".join(shape.slug for shape in brief.Format) + ")$"
FORMAT_OF_SLUG = {shape.slug: shape for shape in brief.Format}


class FormatLink(BaseModel):
    """A format of the video the brief asked for, as the video stage made it: its file, frame size and poster."""

    format: brief.Format
    width: int = Field(ge=1, description="in pixels")
    height: int = Field(ge=1, description="in pixels")
    video: ArtifactLink
    poster: ArtifactLink | None = Field(description="a still of this format's video (JPEG); null when none was made")

    @classmethod
    def of(cls, pipeline_id: str, render: dict[str, Any]) -> FormatLink:
        told = events.Render.model_validate(render)
        path = f"formats/{told.format.slug}"
        poster = told.poster and ArtifactLink.of(
            pipeline_id, events.Stage.VIDEO, told.poster.model_dump(mode="json"), f"{path}/poster"
        )
        return cls(
            format=told.format,
            width=told.width,
            height=told.height,
            video=ArtifactLink.of(pipeline_id, events.Stage.VIDEO, told.artifact.model_dump(mode="json"), path),
            poster=poster,
        )


class CaptionFormat(enum.StrEnum):
    """A caption file of the sung lines."""

    SRT = "srt"  # SubRip: a cue per line
    VTT = "vtt"  # WebVTT: a cue per line, each syllable after the first timed within it (karaoke)


CAPTION_MEDIA_TYPES = {CaptionFormat.SRT: "application/x-subrip", CaptionFormat.VTT: "text/vtt"}


class CaptionLink(BaseModel):
    """The song's sung lines as a caption file, which the gateway makes from the song stage's own timings."""

    format: CaptionFormat
    media_type: str
    download: str = Field(description="the gateway's path that serves the file (an API key with `read`)")

    @classmethod
    def of(cls, pipeline_id: str, form: CaptionFormat) -> CaptionLink:
        return cls(
            format=form,
            media_type=CAPTION_MEDIA_TYPES[form],
            download=f"/v1/pipelines/{pipeline_id}/artifacts/{events.Stage.SONG.value}/captions.{form.value}",
        )


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


class DraftView(BaseModel):
    """A draft a stage made for a person to decide on, and what became of it."""

    id: str = Field(description="what a decision names (`draft`)")
    stage: events.Stage
    round: int = Field(description="new drafts asked for before this one")
    text: str = Field(description="the lyrics as a person reads and edits them: the title, then `[verse]` ... lines")
    drafted_at: dt.datetime
    review_until: dt.datetime = Field(description="when it comes to `on_timeout` if no one decided")
    on_timeout: Literal["approve", "cancel"]
    regenerations_left: int = Field(description="new drafts a `regenerate` may still ask for")
    decision: str | None = Field(
        description="approve, edit or regenerate, as a key decided; approve or cancel when it timed out; null while"
        " it waits"
    )
    edited_text: str | None = Field(default=None, description="for edit: the final lyrics, sung as written")
    note: str | None = Field(default=None, description="for regenerate: what it asked to change")
    decided_at: dt.datetime | None = None
    decided_by_key_id: str | None = Field(default=None, description="the key that decided (null: its timeout)")
    expired_at: dt.datetime | None = Field(default=None, description="when it timed out undecided")


class ReviewView(BaseModel):
    """The review a pipeline asked for, and its current draft."""

    asked: brief.Review
    draft: DraftView | None = Field(description="the newest draft (null until the first is made)")


class ReviewChoice(BaseModel):
    """A person's decision on a draft (a notice's link names the draft)."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "edit", "regenerate"] = Field(
        description="approve: the song is made of the draft; edit: of `lyrics` instead, exactly as written;"
        " regenerate: a new draft is written (told `note`, if given)"
    )
    lyrics: str | None = Field(
        default=None,
        max_length=events.MAX_LYRICS_CHARS,
        validate_default=True,
        description="for edit, and only then: the final lyrics as the draft's `text` writes them (a title line,"
        f" then sections: a `[verse]`, `[chorus]` or `[bridge]` line and its lines; at most {events.MAX_SECTIONS}"
        f" sections of {events.MAX_SECTION_LINES} lines of {events.MAX_LINE_CHARS} characters)",
    )
    note: brief.Details | None = Field(
        default=None, max_length=500, description="for regenerate, and only then: what to change (optional)"
    )

    @field_validator("lyrics")
    @classmethod
    def _lyrics_for_edit(cls, lyrics: str | None, info: ValidationInfo) -> str | None:
        decision = info.data.get("decision")
        if decision == "edit" and not (lyrics or "").strip():
            raise ValueError("an edit gives the final lyrics")
        if decision not in ("edit", None) and lyrics is not None:
            raise ValueError(f"only an edit gives lyrics, not {decision}")
        return lyrics

    @field_validator("note")
    @classmethod
    def _note_for_regenerate(cls, note: str | None, info: ValidationInfo) -> str | None:
        decision = info.data.get("decision")
        if decision not in ("regenerate", None) and note is not None:
            raise ValueError(f"only a regenerate gives a note, not {decision}")
        return note


class ReviewDecision(ReviewChoice):
    """A person's decision on a pipeline's current draft."""

    draft: str = Field(pattern=brief.UUID_PATTERN, description="the draft decided on: the pipeline's current one")


class ReviewAccepted(BaseModel):
    """A decision recorded: the stage applies it; the pipeline's status and event stream follow."""

    id: str
    draft: str
    decision: str
    status: str = Field(description="the pipeline's status now (AWAITING_REVIEW until the stage has applied it)")
    links: Links


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


class Problem(BaseModel):
    detail: str


class Caller(BaseModel):
    """The API key that calls: whose it is and what it may do."""

    key_id: str
    tenant: str
    name: str = Field(description="what the key is for, as its maker said")
    scopes: list[str] = Field(description="submit, read, operate, admin (admin may do everything)")


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


class BrandKitRequest(BaseModel):
    """A tenant's brand kit as a key with `submit` sets it: every brief of the tenant uses it from then on."""

    model_config = ConfigDict(extra="forbid")

    logo: brief.ImageId | None = Field(
        default=None, description="an image the tenant uploaded (POST /v1/images), shown in a corner of every frame"
    )
    colors: list[brief.HexColour] = Field(
        min_length=1,
        max_length=brief.MAX_BRAND_COLOURS,
        description="#rrggbb: the main colour, then the accent",
        examples=[["#0b3d91", "#ffc20e"]],
    )
    font: brief.FontFamily | None = Field(default=None, description="the family of the title and captions")
    caption_style: brief.CaptionStyle = Field(default_factory=brief.CaptionStyle)


class BrandKit(BrandKitRequest):
    """A tenant's brand kit, as set last."""

    model_config = ConfigDict(extra="ignore")  # an answer: what a newer gateway adds is read past

    logo_download: str | None = Field(description="the gateway's path of the logo's file (GET /v1/images/{id}/content)")
    updated_at: dt.datetime


class Image(BaseModel):
    """An uploaded image, as the gateway stored it: decoded, turned upright, its metadata stripped."""

    id: str = Field(description="what a brief's `photos` names it by")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="of the stored bytes (not of the upload)")
    media_type: str = Field(examples=["image/jpeg"])
    size: int = Field(ge=1, description="size in bytes of the stored file")
    width: int = Field(ge=1, description="in pixels, upright")
    height: int = Field(ge=1, description="in pixels, upright")
    created_at: dt.datetime


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


class ErrorInfo(BaseModel):
    code: str
    message: str


class TimelineEntry(BaseModel):
    """One entry of a pipeline's timeline: a stage's event, an operator's action, a dead letter about it."""

    seq: int = Field(
        description="its number among its pipeline's entries (1, 2, ...): where its timeline's `after` and its"
        " pipeline's event stream (Last-Event-ID) resume"
    )
    time: dt.datetime = Field(description="when it happened: the event's own time")
    event_type: str = Field(description="e.g. song.retrying, pipeline.cancel_requested, dead_letter.replayed")
    step: str = Field(description="lyric, song, video, or pipeline for what concerns the whole pipeline")
    status: str = Field(
        description="what happened: requested, started, retrying, drafted, review_decided, review_expired, completed,"
        " failed, canceled, cancel_requested, retry_requested, dead_letter_recorded, dead_letter_replayed,"
        " dead_letter_discarded"
    )
    pipeline_status: str = Field(description="the pipeline's status after it")
    progress: int = Field(ge=0, le=100, description="the pipeline's progress after it, in percent")
    attempt: int | None = Field(default=None, description="the stage's attempt it is about")
    worker: str | None = Field(
        default=None, description="started: the worker that runs the attempt (to a tenant: an opaque id)"
    )
    error: ErrorInfo | None = Field(default=None, description="its code, and to a tenant the code's public message")
    next_attempt_at: dt.datetime | None = Field(default=None, description="retrying: when the next attempt is due")
    max_attempts: int | None = Field(default=None, description="retrying: the number of the last attempt that may run")
    attempt_budgets: dict[events.Stage, int] | None = Field(
        default=None, description="retry_requested: the attempt budgets the operator gave"
    )
    actor: str | None = Field(default=None, description="an operator's action: who acted (its X-Castad-Actor)")
    actor_key_id: str | None = Field(
        default=None, description="an operator's action: the API key that acted (shown to a tenant for its own keys)"
    )
    actor_key_name: str | None = Field(default=None, description="an operator's action: that key's name")
    reason: str | None = Field(default=None, description="a cancel's reason, or a dead letter's")
    operation: int | None = Field(default=None, description="the number of an operator's cancel or retry")
    resume: events.Stage | None = Field(default=None, description="retry_requested: the stage that runs again")
    dead_letter: int | None = Field(default=None, description="the dead letter it is about")
    detail: str | None = Field(default=None, description="what was done with a dead letter")
    artifact: ArtifactLink | None = Field(default=None, description="completed: the stage's file")
    artifacts: dict[events.Stage, ArtifactLink] | None = Field(
        default=None, description="on the pipeline's end: every file it has"
    )
    draft: dict[str, Any] | None = Field(
        default=None,
        description="drafted: the draft for review (id, round, text, review_until, on_timeout); review_decided: the"
        " decision (id, decision, note); review_expired: the draft that timed out (id, on_timeout)",
    )


class AttemptView(BaseModel):
    """An attempt of a stage as its events told the gateway."""

    stage: events.Stage
    attempt: int
    worker: str | None = Field(
        description="who ran it (to a tenant: an opaque id, the same for one worker within the pipeline); null if"
        " its start did not say or has not been heard of"
    )
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    duration_s: float | None = Field(description="from its start to its end; null until both are known")
    outcome: str = Field(
        description="running; succeeded; failed_retryable (the work failed, the stage tries again); failed (for"
        " good); interrupted (the machinery lost it: a worker stopped or died, an outage; not counted); canceled"
    )
    error_code: str | None
    error_message: str | None = Field(description="to a tenant: its code's public message")


class OperatorAction(BaseModel):
    """What an operator (or the deadline) did to the pipeline, from its timeline."""

    seq: int
    time: dt.datetime
    action: str = Field(description="cancel_requested, retry_requested, dead_letter_replayed, dead_letter_discarded")
    actor: str | None = Field(description="who acted (`deadline` for a cancel the deadline made)")
    actor_key_id: str | None = Field(default=None, description="the API key that acted (a tenant's: its own only)")
    actor_key_name: str | None = Field(default=None, description="that key's name")
    reason: str | None
    operation: int | None
    resume: events.Stage | None
    dead_letter: int | None
    detail: str | None


class PipelineTimeline(BaseModel):
    """Everything that happened to a pipeline, in order, with its attempts and the operators' actions."""

    id: str
    status: str
    trace_id: str | None = Field(description="the pipeline's trace (W3C trace id); null if none was recorded")
    trace_url: str | None = Field(description="the trace in a trace viewer (CASTAD_API_TRACE_URL); null: none set")
    entries: list[TimelineEntry] = Field(
        description="by the time each happened (seq breaks ties); a page holds the entries of the lowest seqs"
    )
    next_after: int | None = Field(
        description="more entries follow: pass as `after` for the next ones (the page's highest seq); null when"
        " these are the last"
    )
    attempts: list[AttemptView] = Field(description="every attempt of every stage, by stage order and number")
    actions: list[OperatorAction] = Field(description="the operators' actions among these entries")
    links: Links


class FirehoseEntry(TimelineEntry):
    """A timeline entry on the stream of every pipeline, with what a board shows of its pipeline.

    Its event's id (Last-Event-ID) is a cursor of that stream: to an admin key, the entry's place among every entry
    of the gateway; to a tenant's, an opaque one that counts nothing.
    """

    pipeline_id: str
    tenant: str
    customer_name: str
    region: str


class Percentiles(BaseModel):
    count: int = Field(description="how many durations these are of")
    p50: float
    p95: float
    p99: float


class ErrorCount(BaseModel):
    code: str
    count: int = Field(description="attempts of the stage that ended with this error code in the window")
    rate: float = Field(description="their share of the attempts of the stage that ended in the window")


class StageStats(BaseModel):
    stage: events.Stage
    pending: int = Field(description="in-flight pipelines waiting for this stage (it has not started)")
    running: int = Field(description="in-flight pipelines whose attempt of this stage runs")
    retry_waiting: int = Field(description="in-flight pipelines waiting for this stage's next attempt")
    stuck: int = Field(description="of `running`: attempts started longer ago than CASTAD_API_STUCK_AFTER_S")
    succeeded: int = Field(description="runs of this stage that succeeded in the window")
    failed: int = Field(description="runs of this stage that failed in the window")
    canceled: int = Field(description="runs of this stage canceled in the window")
    failure_rate: float | None = Field(description="failed / (succeeded + failed); null when neither")
    duration_s: Percentiles | None = Field(
        description="of the runs that succeeded in the window, from their first attempt's start to the end"
    )
    attempts: int = Field(description="attempts that ended in the window")
    attempt_outcomes: dict[str, int] = Field(description="those attempts by outcome")
    attempt_duration_s: Percentiles | None = Field(description="of those attempts whose start is known")
    errors: list[ErrorCount] = Field(description="those attempts by error code, the most frequent first")


class PipelineCounts(BaseModel):
    in_flight: int = Field(description="pipelines that have not ended")
    in_flight_by_status: dict[str, int] = Field(description="PENDING, RUNNING, AWAITING_REVIEW and CANCELING")
    created: int = Field(description="pipelines created in the window")
    finished: dict[str, int] = Field(description="pipelines that ended in the window: SUCCEEDED, FAILED, CANCELED")


class ThroughputBucket(BaseModel):
    start: dt.datetime
    created: int
    succeeded: int
    failed: int
    canceled: int


class Throughput(BaseModel):
    per_minute: dict[str, float] = Field(
        description="created, succeeded, failed and canceled pipelines per minute, averaged over the window"
    )
    bucket_s: int = Field(description="the length of each bucket")
    buckets: list[ThroughputBucket] = Field(description="every bucket of the window, oldest first")


class StuckAttempt(BaseModel):
    pipeline_id: str
    stage: events.Stage
    attempt: int
    worker: str | None
    started_at: dt.datetime
    running_s: float


class WaitingReview(BaseModel):
    pipeline_id: str
    drafted_at: dt.datetime
    waiting_s: float
    review_until: dt.datetime


class ReviewCounts(BaseModel):
    waiting: int = Field(description="drafts that wait for a person's decision now")
    oldest: list[WaitingReview] = Field(description="the drafts that waited longest, oldest first (up to 20)")


class DeadLetterCounts(BaseModel):
    open: dict[str, int] = Field(description="dead letters still `dead` by kind (message, parked, unrecordable)")
    received: dict[str, dict[str, int]] = Field(
        description="dead letters received in the window, by kind then by status (dead, replayed, discarded)"
    )


class Stats(BaseModel):
    """The gateway's numbers over a window, from its own projection of every event."""

    at: dt.datetime = Field(description="when they were read")
    window_s: int
    since: dt.datetime
    stuck_after_s: float = Field(
        description="a stage RUNNING whose attempt started longer ago is counted as stuck: the gateway does not see"
        " leases, so this is the longest an attempt may run plus its lease (CASTAD_API_STUCK_AFTER_S)"
    )
    pipelines: PipelineCounts
    stages: list[StageStats]
    stuck: list[StuckAttempt] = Field(description="the longest-running stuck attempts, oldest first (up to 20)")
    reviews: ReviewCounts = Field(
        default_factory=lambda: ReviewCounts(waiting=0, oldest=[]),
        description="drafts waiting for a person's decision (AWAITING_REVIEW), with how long they waited",
    )
    dead_letters: DeadLetterCounts
    throughput: Throughput


class Meter(enum.StrEnum):
    """What a tenant's usage is counted in, per UTC day (GET /v1/usage)."""

    PIPELINES = "pipelines"  # made (a brief, or a remake), when accepted
    LYRIC_CALLS = "lyric_calls"  # requests for work each stage sent its provider (polls are not)
    SONG_CALLS = "song_calls"
    VIDEO_CALLS = "video_calls"
    SONG_SECONDS = "song_seconds"  # of song made
    VIDEO_SECONDS = "video_seconds"  # of video made, each format's counted
    STORED_BYTES = "stored_bytes"  # of files the stages kept (songs, videos, posters, fetched photos, lyrics)


def calls_meter(stage: events.Stage) -> Meter:
    """The meter of the requests for work `stage` sent its provider."""
    return Meter(f"{stage.value}_calls")


class Meters(BaseModel):
    """Usage by meter, and what it cost by the installation's price table (CASTAD_API_PRICES)."""

    pipelines: int = 0
    lyric_calls: int = 0
    song_calls: int = 0
    video_calls: int = 0
    song_seconds: float = 0.0
    video_seconds: float = 0.0
    stored_bytes: int = 0
    estimated_cost: float = Field(default=0.0, description="each meter times its price, summed")


class UsageDay(Meters):
    tenant: str
    day: dt.date = Field(description="a UTC day")


BudgetPeriod = Literal["day", "month"]


class Budget(BaseModel):
    """A tenant's limits for a UTC day or month (castad-admin tenants budget), and what it used of them so far."""

    period: BudgetPeriod
    pipelines: int | None = Field(description="pipelines it may make (null: no limit)")
    song_seconds: float | None = Field(description="seconds of song it may have made (null: no limit)")
    cost: float | None = Field(description="estimated cost it may reach (null: no limit)")
    used: Meters = Field(description="what it used so far this period")
    resets_at: dt.datetime = Field(description="when the period ends and its count starts again")


class Usage(BaseModel):
    """What a tenant used per UTC day (an admin key: every tenant's, or the one it asks for)."""

    tenant: str | None = Field(description="whose (null: every tenant's, for an admin key)")
    from_: dt.date = Field(alias="from", description="the first day counted (UTC)")
    to: dt.date = Field(description="the last day counted (UTC)")
    currency: str = Field(description="of the estimated costs (CASTAD_API_CURRENCY)")
    prices: dict[Meter, float] = Field(description="the price of one unit of each meter priced (CASTAD_API_PRICES)")
    days: list[UsageDay] = Field(description="each tenant's days that used anything, by day then tenant")
    total: Meters = Field(description="the days summed")
    weight: int | None = Field(description="the tenant's weight in the stages' fair turns (null: every tenant's)")
    budgets: list[Budget] = Field(description="the tenant's budgets (none: no limit; empty for every tenant's)")

    model_config = ConfigDict(populate_by_name=True)
