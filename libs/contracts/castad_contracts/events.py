"""Typed payloads of every event Castad publishes, and their registry.

Event types are past-tense facts. A payload is self-contained: a consumer never
calls the producer to do its work. Each type carries a schema version; when a
payload changes shape, register a new model under the next version with an upcast
from the previous one (see Registry), so that events still sitting in a queue stay
consumable.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import typing
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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

    def text(self) -> str:
        """As a person reads and edits them (the lyric stage's file): the title, then each `[kind]` and its lines."""
        parts = [self.title, ""]
        for section in self.sections:
            parts.append(f"[{section.kind}]")
            parts.extend(section.lines)
            parts.append("")
        return "\n".join(parts)


# What lyrics may hold: a person's edit is held to the limits a writer's lyrics are (castad_lyric.chat).
MAX_SECTIONS = 12
MAX_SECTION_LINES = 12
MAX_LINE_CHARS = 120
MAX_LYRICS_CHARS = 8_000
_SECTION_HEADING = re.compile(r"^\[(\w+)\]$")


def lyrics_from_text(text: str, language: brief_.Language) -> Lyrics:
    """Lyrics written as `Lyrics.text` writes them; ValueError saying what breaks the limits, and where."""
    if len(text) > MAX_LYRICS_CHARS:
        raise ValueError(f"are {len(text)} characters long, more than {MAX_LYRICS_CHARS}")
    title, kind = "", None
    sections: list[tuple[str, list[str], int]] = []
    lines: list[str] = []
    kinds = typing.get_args(LyricSection.model_fields["kind"].annotation)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if any(ord(char) < 32 and char != "\t" for char in line):
            raise ValueError(f"line {number} holds a control character")
        if len(line) > MAX_LINE_CHARS:
            raise ValueError(f"line {number} is {len(line)} characters long, more than {MAX_LINE_CHARS}")
        heading = _SECTION_HEADING.match(line)
        if not title and heading is not None:
            raise ValueError(f"line {number}: the first line is the title, before any section heading")
        if not title:
            title = line
        elif heading is not None:
            if heading.group(1) not in kinds:
                raise ValueError(f"line {number}: [{heading.group(1)}] is not a section ({', '.join(kinds)})")
            if kind is not None:
                sections.append((kind, lines, number))
            kind, lines = heading.group(1), []
        elif kind is None:
            raise ValueError(f"line {number} comes before the first section heading, such as [verse]")
        else:
            lines.append(line)
    if kind is not None:
        sections.append((kind, lines, len(text.splitlines())))
    if not title:
        raise ValueError("have no title: the first line is the title")
    if not sections:
        raise ValueError("have no section: write [verse], [chorus] or [bridge], then its lines")
    if len(sections) > MAX_SECTIONS:
        raise ValueError(f"have {len(sections)} sections, more than {MAX_SECTIONS}")
    for kind, lines, number in sections:
        if not lines:
            raise ValueError(f"the [{kind}] before line {number} has no lines")
        if len(lines) > MAX_SECTION_LINES:
            raise ValueError(f"a [{kind}] has {len(lines)} lines, more than {MAX_SECTION_LINES}")
    return Lyrics(
        title=title,
        language=language,
        sections=tuple(LyricSection(kind=kind, lines=tuple(lines)) for kind, lines, _ in sections),
    )


class TimedLineV2(BaseModel):
    """A lyric line and when it is sung (versions 1 and 2 of song.completed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    start_s: float = Field(ge=0)
    end_s: float = Field(ge=0)


class TimedSyllable(BaseModel):
    """A sung syllable of a line: the characters it sings and when."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(description="the characters of the line it sings; empty when it sings on the ones before")
    at: int = Field(ge=0, description="offset of those characters in the line's text")
    start_s: float = Field(ge=0)
    end_s: float = Field(ge=0)


class TimedLine(TimedLineV2):
    """A lyric line and when it is sung, and (version 3) when each of its syllables is."""

    syllables: tuple[TimedSyllable, ...] = Field(
        default=(), description="every syllable in order; empty when the singer did not say (a version-2 event)"
    )


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


class PipelineRequestedV6(Payload):
    brief: brief_.Brief
    requested_at: dt.datetime
    max_attempts: dict[Stage, int] | None = Field(
        default=None, description="Per-stage override of the configured maximum attempts."
    )


class PipelineRequested(PipelineRequestedV6):
    review: brief_.Review | None = Field(
        default=None,
        exclude_if=lambda review: review is None,  # as a brief's formats: one without it reads as before reviews
        description="a person decides on the lyrics' draft before the song is made (None: no review)",
    )
    remake: Remake | None = REMAKE
    share: Share | None = SHARE


class StageStartedV1(Payload):
    stage: Stage
    job_id: str
    attempt: int = Field(ge=1)
    started_at: dt.datetime


class StageStarted(StageStartedV1):
    """An attempt began (version 2: and which worker runs it)."""

    worker: str | None = Field(
        description="the worker that claimed the attempt (service@host:pid); null: a version-1 event, which did"
        " not say",
    )


class StageRetrying(Payload):
    stage: Stage
    job_id: str
    attempt: int = Field(ge=1, description="the attempt that failed or was handed back")
    max_attempts: int = Field(
        description="number of the last attempt that may run: attempts handed back by a stopping or lost worker"
        " (error codes worker_stopped, lease_expired, outage) are not counted against the budget"
    )
    error_code: str
    error_message: str
    next_attempt_at: dt.datetime
    provider_calls: int | None = PROVIDER_CALLS


class StageFailed(Payload):
    stage: Stage
    job_id: str
    attempt: int
    error_code: str
    error_message: str
    failed_at: dt.datetime
    provider_calls: int | None = PROVIDER_CALLS


class StageCompleted(Payload):
    stage: Stage
    job_id: str
    attempt: int
    artifact: Artifact
    completed_at: dt.datetime
    brief: brief_.Brief
    max_attempts: dict[Stage, int] | None = None
    provider_calls: int | None = PROVIDER_CALLS


class LyricCompleted(StageCompleted):
    lyrics: Lyrics
    remake: Remake | None = REMAKE  # passed on, so that each stage before the one made again reuses its output
    share: Share | None = SHARE  # passed on, so that each stage takes its turns fairly


class SongCompletedV2(StageCompleted):
    brief: brief_.BriefV2  # type: ignore[assignment]
    lyrics: Lyrics
    timed_lines: tuple[TimedLineV2, ...]
    song_duration_s: float


class SongCompletedV3(SongCompletedV2):
    """The song is made (version 3: with the time of each sung syllable)."""

    timed_lines: tuple[TimedLine, ...]


class SongCompletedV4(SongCompletedV3):
    """The song is made (version 4: the brief names its uploaded photos)."""

    brief: brief_.BriefV3


class SongCompleted(SongCompletedV4):
    """The song is made (version 5: photos named by URL too, and when each bar of the song begins)."""

    brief: brief_.Brief
    remake: Remake | None = REMAKE
    share: Share | None = SHARE
    bars_s: tuple[float, ...] = Field(
        default=(),
        description="when each bar of the song begins, in seconds from its start; empty when the music provider"
        " does not say (an earlier version's event, a music API that tells no tempo)",
    )


class VideoCompletedV4(StageCompleted):
    """The video is made, and its frame size (versions 1 to 4)."""

    brief: brief_.BriefV4  # type: ignore[assignment]
    width: int
    height: int


class FetchedPhoto(BaseModel):
    """A photo the brief names by URL as the video stage fetched, cleaned and kept it.

    A file of the pipeline's video stage, referenced by location and content hash, never its bytes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    photo: int = Field(ge=0, description="its place in the brief's photos, from 0")
    url: str = Field(description="the URL the brief names it by")
    file: Artifact = Field(description="the kept file, in the video stage's place of the pipeline")
    width: int | None = Field(default=None, ge=1, description="in pixels, upright; null when not said")
    height: int | None = Field(default=None, ge=1, description="in pixels, upright; null when not said")


class VideoCompletedV5(VideoCompletedV4):
    """The video is made (version 5: with the photos named by URL that the stage fetched and kept)."""

    fetched_photos: tuple[FetchedPhoto, ...] = Field(
        default=(),
        description="each photo of the brief named by URL, in the brief's order, as kept for this video; empty"
        " when the brief names none or the renderer fetches them itself (a render API; an earlier version's event)",
    )


class VideoCompletedV7(VideoCompletedV5):
    """The video is made (versions 6 and 7: the brief's uploaded photos sealed by the gateway)."""

    brief: brief_.BriefV5


POSTER = (
    "a still of the video (JPEG, its frame size) at a moment that shows the business's name over the first photo,"
    " in the video stage's place; null when the renderer made none (a render API; an earlier version's event)"
)


class VideoCompletedV8(VideoCompletedV7):
    """The video is made (version 8: with its poster)."""

    poster: Artifact | None = Field(default=None, description=POSTER)


class Render(BaseModel):
    """A format of the video, rendered from the same song: its file, frame size and poster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: brief_.Format
    artifact: Artifact = Field(description="the MP4, in the video stage's place of the pipeline")
    width: int = Field(ge=1)
    height: int = Field(ge=1)
    poster: Artifact | None = Field(default=None, description=POSTER)


class VideoCompleted(VideoCompletedV8):
    """The video is made (version 9: in each format the brief asks for; version 10: and how long it lasts)."""

    brief: brief_.Brief
    more_formats: tuple[Render, ...] = Field(
        default=(),
        description="the brief's formats after its first, in its order, each made; the first is this event's"
        " artifact, width, height and poster (empty: one format, or an earlier version's event)",
    )
    duration_s: float | None = Field(
        default=None,
        ge=0,
        exclude_if=lambda seconds: seconds is None,
        description="how long each format's video lasts, in seconds: its song's length (version 10; null before)",
    )

    @model_validator(mode="after")
    def _every_format_after_the_first(self) -> Self:
        """Its more formats are the brief's after the first, in the brief's order: each file is told as its own."""
        named = tuple(render.format for render in self.more_formats)
        if named != self.brief.frames[1:]:
            asked, told = ", ".join(self.brief.frames[1:]) or "none", ", ".join(named) or "none"
            raise ValueError(f"more_formats name {told}, not the brief's after its first ({asked})")
        return self

    def renders(self) -> tuple[Render, ...]:
        """Every format made, the first (the event's own artifact) first."""
        first = Render(
            format=self.brief.frames[0],
            artifact=self.artifact,
            width=self.width,
            height=self.height,
            poster=self.poster,
        )
        return (first, *self.more_formats)


OPERATION = (
    "number of this operator request among the pipeline's cancels and retries, from 1; every stage applies"
    " them in this order"
)


class LyricDrafted(Payload):
    """The lyric stage's draft waits for a person's decision (the pipeline asked for a review); it holds no worker."""

    stage: Stage
    job_id: str
    attempt: int = Field(ge=1, description="the attempt that wrote the draft")
    draft_id: str = Field(description="what a decision names: only the newest draft of a pipeline is decided on")
    round: int = Field(ge=0, description="drafts the review asked for again before this one (regenerate)")
    lyrics: Lyrics
    artifact: Artifact = Field(description="the draft as text, as `Lyrics.text` writes it")
    review_until: dt.datetime = Field(description="when the draft, undecided, comes to `on_timeout`")
    on_timeout: Literal["approve", "cancel"]
    drafted_at: dt.datetime
    provider_calls: int | None = PROVIDER_CALLS


class StageReviewExpired(Payload):
    """No decision came for a draft in time: approved as it is (its `completed` follows), or the pipeline to cancel.

    The stage keeps the draft waiting until the gateway's cancel comes; it says this again while it waits."""

    stage: Stage
    job_id: str
    attempt: int = Field(ge=1)
    draft_id: str
    on_timeout: Literal["approve", "cancel"]
    expired_at: dt.datetime


class PipelineReviewDecided(Payload):
    """A person's decision on a draft, as the gateway recorded it: the stage applies it once, to that draft alone."""

    draft_id: str
    decision: Literal["approve", "edit", "regenerate"]
    lyrics: Lyrics | None = Field(default=None, description="for edit: the final lyrics, sung exactly as written")
    note: brief_.Details | None = Field(default=None, description="for regenerate: what to change, if said")
    decided_by: str = Field(description="the acting key's id; `link` for a notice's link, `timeout` for its timeout")
    decided_at: dt.datetime


class StageCanceled(Payload):
    """A stage stopped its job for a cancel request, or, having none yet, will never start one."""

    stage: Stage
    job_id: str
    attempt: int = Field(ge=0, description="attempts the job had started (0: canceled before it ever ran)")
    operation: int = Field(ge=1, description="the cancel request this answers")
    reason: str
    canceled_at: dt.datetime
    provider_calls: int | None = PROVIDER_CALLS


# Before a brief named formats (pipeline.requested up to v5, lyric.completed up to v6, song.completed up to v7,
# video.completed up to v8) each pipeline made one video, in the orientation's format; the versions after read each
# such brief as asking for that one.
BriefV5 = brief_.BriefV5


class PipelineRequestedV5(PipelineRequestedV6):
    brief: BriefV5  # type: ignore[assignment]


class LyricCompletedV6(LyricCompleted):
    brief: BriefV5  # type: ignore[assignment]


class SongCompletedV7(SongCompleted):
    brief: BriefV5  # type: ignore[assignment]


# Before the gateway sealed the photos (pipeline.requested and lyric.completed up to v4, song.completed up to v5,
# video.completed up to v5) a brief named them unsealed; the versions after read each such photo as one without a
# seal, which a video stage that checks seals uses only for a job begun before its cut-off
# (castad_video.service.checked_photos).
BriefV4 = brief_.BriefV4


class PipelineRequestedV4(PipelineRequestedV6):
    brief: BriefV4  # type: ignore[assignment]


class LyricCompletedV4(LyricCompleted):
    brief: BriefV4  # type: ignore[assignment]


class SongCompletedV5(SongCompleted):
    brief: BriefV4  # type: ignore[assignment]


# Before photos by URL (pipeline.requested, lyric.completed and video.completed up to v3, song.completed up to v4)
# a brief named uploads only, and song.completed told no bars; the versions after read each as it is.
BriefV3 = brief_.BriefV3


class PipelineRequestedV3(PipelineRequestedV6):
    brief: BriefV3  # type: ignore[assignment]


class LyricCompletedV3(LyricCompleted):
    brief: BriefV3  # type: ignore[assignment]


class VideoCompletedV3(VideoCompletedV4):
    brief: BriefV3  # type: ignore[assignment]


# Before photos (pipeline.requested, lyric.completed and video.completed up to v2, song.completed up to v3) a brief
# named none; the versions after read each such event as a brief without photos.
BriefV2 = brief_.BriefV2


class PipelineRequestedV2(PipelineRequestedV6):
    brief: BriefV2  # type: ignore[assignment]


class LyricCompletedV2(LyricCompleted):
    brief: BriefV2  # type: ignore[assignment]


class VideoCompletedV2(VideoCompletedV4):
    brief: BriefV2  # type: ignore[assignment]


# Version 1 of the events that carry a brief or lyrics knew fewer values: a genre from a fixed list and
# Korean or English only. Version 2 (free-text genre, four languages) reads every version-1 event as it is.
BriefV1 = brief_.BriefV1


class LyricsV1(Lyrics):
    language: brief_.V1Language  # type: ignore[assignment]


class PipelineRequestedV1(PipelineRequestedV2):
    brief: BriefV1


class LyricCompletedV1(LyricCompletedV2):
    brief: BriefV1
    lyrics: LyricsV1


class SongCompletedV1(SongCompletedV2):
    brief: BriefV1
    lyrics: LyricsV1


class VideoCompletedV1(VideoCompletedV2):
    brief: BriefV1


def _same(data: dict[str, Any]) -> dict[str, Any]:
    """The upcast of a version whose every payload is valid in the next as it is."""
    return data


class PipelineCancelRequestedV1(Payload):
    reason: str = ""


class PipelineCancelRequested(Payload):
    """Every stage is to stop the pipeline.

    A job not started never starts, a running attempt is stopped, and a stage not reached yet will not start; a
    stage that completed keeps its artifact.
    """

    operation: int = Field(ge=1, description=OPERATION)
    reason: str = Field(max_length=500, description="the operator's words, or deadline_exceeded")


class PipelineRetryRequestedV1(Payload):
    stage: Stage


class PipelineRetryRequested(Payload):
    """A FAILED or CANCELED pipeline resumes at `stage`, the first that did not succeed.

    It gets a fresh attempt budget; stages that succeeded are not run again.
    """

    operation: int = Field(ge=1, description=OPERATION)
    stage: Stage
    max_attempts: dict[Stage, int] | None = Field(
        default=None, description="per-stage attempt budget for this retry (default: each stage's setting)"
    )


class OutboxRepublishRequested(Payload):
    """The service whose outbox holds the parked row with this event id is to hand it back to the relay.

    `pipeline_id` is the row's own.
    """

    event_id: uuid.UUID


class ProviderCalledBack(Payload):
    """A stage's provider called the gateway back about the pipeline's work: its next poll is due now."""

    stage: Stage
    received_at: dt.datetime


PIPELINE_REQUESTED = "pipeline.requested"
PIPELINE_CANCEL_REQUESTED = "pipeline.cancel_requested"
PIPELINE_RETRY_REQUESTED = "pipeline.retry_requested"
OUTBOX_REPUBLISH_REQUESTED = "outbox.republish_requested"
OPERATOR_REQUESTS = (PIPELINE_CANCEL_REQUESTED, PIPELINE_RETRY_REQUESTED, OUTBOX_REPUBLISH_REQUESTED)
PIPELINE_REVIEW_DECIDED = "pipeline.review_decided"
StageFact = Literal["started", "retrying", "completed", "failed", "canceled", "drafted", "review_expired"]
# The stages that draft for a review, and the model of their `drafted` event.
DRAFTED: dict[Stage, type[Payload]] = {Stage.LYRIC: LyricDrafted}
REVIEW_FACTS = ("drafted", "review_expired")  # told only by a stage that drafts


def stage_facts(stage: Stage) -> tuple[StageFact, ...]:
    """What `stage` tells of its jobs."""
    facts: tuple[StageFact, ...] = typing.get_args(StageFact)
    return tuple(fact for fact in facts if stage in DRAFTED or fact not in REVIEW_FACTS)


def stage_event(stage: Stage, fact: StageFact) -> str:
    """The event type by which `stage` tells `fact` about a pipeline's job."""
    return f"{stage.value}.{fact}"


def provider_called_back(stage: Stage) -> str:
    """The event type by which the gateway passes a provider's callback to the stage alone."""
    return f"provider.{stage.value}.called_back"


# The saga's order, written once: the first stage starts on the brief, each later one on its predecessor's result.
TRIGGERS: dict[Stage, str] = {
    stage: PIPELINE_REQUESTED if n == 0 else stage_event(STAGE_ORDER[n - 1], "completed")
    for n, stage in enumerate(STAGE_ORDER)
}


_COMPLETED_V2: dict[Stage, type[Payload]] = {
    Stage.LYRIC: LyricCompletedV2,
    Stage.SONG: SongCompletedV2,
    Stage.VIDEO: VideoCompletedV2,
}
_COMPLETED_V4: dict[Stage, type[Payload]] = {
    Stage.LYRIC: LyricCompletedV4,
    Stage.SONG: SongCompletedV5,
    Stage.VIDEO: VideoCompletedV4,
}
_COMPLETED_V1: dict[Stage, type[Payload]] = {
    Stage.LYRIC: LyricCompletedV1,
    Stage.SONG: SongCompletedV1,
    Stage.VIDEO: VideoCompletedV1,
}

Upcast = Callable[[dict[str, Any]], dict[str, Any]]
Needed = Callable[[Any], bool]


def _kept_in_stage_place(payload: Any) -> bool:
    """Whether a completed event names a file its stage kept in its own place.

    The layout from lyric v6, song and video v7, whose files a release before would refuse as another's.
    """
    files = (payload.artifact, *(fetched.file for fetched in getattr(payload, "fetched_photos", ())))
    files += (payload.poster,) if getattr(payload, "poster", None) else ()
    return any(in_stage_place(file.uri, payload.pipeline_id, payload.stage) for file in files)


def _remade(payload: Any) -> bool:
    """Whether a completed event is of a remake (its `remake` is passed on)."""
    return payload.remake is not None


def _shared_or_metered(payload: Any) -> bool:
    """Whether an event tells whose work it is (`share`), or what its attempt asked of its provider or made."""
    return any(getattr(payload, field, None) is not None for field in ("share", "provider_calls", "duration_s"))


class SchemaError(LookupError):
    """An event this registry cannot read."""


class UnknownEventType(SchemaError):
    """No payload model is registered for this event type, or for this older version of it."""


class NewerSchemaVersion(SchemaError):
    """The event has a newer schema version than this registry knows: its producer was upgraded first."""


class Registry:
    """Event type and schema version -> payload model, and how to read every older version.

    The rule for a schema change (a rolling deploy may run old and new code side by side):
    the producer writes the newest version it knows; a consumer reads every version up to
    the newest it knows, upcasting older ones step by step to its current model, and raises
    NewerSchemaVersion for a version newer than that (its consumer holds such an event for
    a while, waiting for its own upgrade, rather than dead-lettering it). A version is never
    removed, so an event still in a queue or a dead-letter queue stays readable.
    """

    def __init__(self) -> None:
        self._models: dict[tuple[str, int], type[Payload]] = {}
        self._upcasts: dict[tuple[str, int], Upcast] = {}
        self._needed: dict[tuple[str, int], Needed] = {}
        self._current: dict[str, int] = {}

    def register(
        self,
        event_type: str,
        version: int,
        model: type[Payload],
        upcast: Upcast | None = None,
        needed: Needed | None = None,
    ) -> None:
        """Add `version` of an event type; from version 2 on, `upcast` turns version-1 data into this version's.

        `needed`, for a version that changes what a value means rather than the shape: which payloads need this
        version though an older one could hold their data (a file in a new place), so that no producer writes them
        as that older version to a release that would misread them.
        """
        if version != self._current.get(event_type, 0) + 1:
            raise ValueError(f"{event_type}: version {version} does not follow {self._current.get(event_type, 0)}")
        if (version > 1) != (upcast is not None):
            raise ValueError(f"{event_type} v{version}: an upcast from the previous version is needed from v2 on")
        self._models[(event_type, version)] = model
        if upcast is not None:
            self._upcasts[(event_type, version)] = upcast
        if needed is not None:
            self._needed[(event_type, version)] = needed
        self._current[event_type] = version

    def copy(self) -> Registry:
        """An independent registry with the same entries (to add versions to, e.g. in a test)."""
        other = Registry()
        other._models, other._upcasts, other._current = dict(self._models), dict(self._upcasts), dict(self._current)
        other._needed = dict(self._needed)
        return other

    def until(self, event_type: str, version: int) -> Registry:
        """This registry as a release that knew `event_type` up to `version` only (and every other type as this)."""
        other = self.copy()
        for newer in range(version + 1, self.current_version(event_type) + 1):
            del other._models[(event_type, newer)], other._upcasts[(event_type, newer)]
            other._needed.pop((event_type, newer), None)
        other._current[event_type] = version
        return other

    def current_version(self, event_type: str) -> int:
        try:
            return self._current[event_type]
        except KeyError:
            raise UnknownEventType(f"no payload model for {event_type!r}") from None

    def model(self, event_type: str, version: int) -> type[Payload]:
        try:
            return self._models[(event_type, version)]
        except KeyError:
            raise UnknownEventType(f"no payload model for {event_type!r} version {version}") from None

    def read(self, event_type: str, version: int, data: dict[str, Any]) -> Payload:
        """The payload as the current model of its type, upcast from an older version if need be.

        Raises UnknownEventType, NewerSchemaVersion or pydantic.ValidationError.
        """
        current = self.current_version(event_type)
        if version > current:
            raise NewerSchemaVersion(f"{event_type} version {version} is newer than {current}, the newest known here")
        payload = self.model(event_type, version).model_validate(data)
        for step in range(version + 1, current + 1):
            upgraded = self._upcasts[(event_type, step)](payload.model_dump(mode="json"))
            payload = self._models[(event_type, step)].model_validate(upgraded)
        return payload

    def oldest_carrying(self, event_type: str, payload: Payload) -> tuple[int, dict[str, Any]]:
        """The oldest version of `event_type` that carries `payload` whole, and the payload's data in it.

        What a producer writes, and a stage stores as a job's input: a reader of an earlier release reads every
        event it can represent (a brief without photos, say, as a release before photos read it), and only one
        that needs a newer version waits for a reader of a newer release. Whole: read back through the upcasts, it
        is `payload` again; and never older than a version the payload is `needed` by (see `register`)."""
        current = self.current_version(event_type)
        data = payload.model_dump(mode="json")
        needing = [
            version for (kind, version), needed in self._needed.items() if kind == event_type and needed(payload)
        ]
        for version in range(max(needing, default=1), current):
            older = _projected(self.model(event_type, version), data)  # without what that version has not
            try:
                if self.read(event_type, version, older) == payload:
                    return version, older
            except ValidationError:
                continue  # a value this version does not allow
        return current, data

    def type_of(self, model: type[Payload]) -> str:
        """The event type whose current version `model` is."""
        for event_type, version in self._current.items():
            if self._models[(event_type, version)] is model:
                return event_type
        raise UnknownEventType(f"{model.__name__} is the current model of no event type")

    def items(self) -> list[tuple[tuple[str, int], type[Payload]]]:
        return sorted(self._models.items())

    @property
    def event_types(self) -> tuple[str, ...]:
        return tuple(sorted(self._current))


def _projected(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """`data` without the fields `model` has not, its nested models' included.

    Whether they held anything that version cannot carry, the round trip through the upcasts tells
    (`Registry.oldest_carrying`)."""
    kept = {}
    for name, value in data.items():
        field = model.model_fields.get(name)
        if field is None:
            continue
        nested = field.annotation
        if isinstance(value, dict) and isinstance(nested, type) and issubclass(nested, BaseModel):
            value = _projected(nested, value)
        kept[name] = value
    return kept


REGISTRY = Registry()
REGISTRY.register(PIPELINE_REQUESTED, 1, PipelineRequestedV1)
REGISTRY.register(PIPELINE_REQUESTED, 2, PipelineRequestedV2, _same)
REGISTRY.register(PIPELINE_REQUESTED, 3, PipelineRequestedV3, _same)
REGISTRY.register(PIPELINE_REQUESTED, 4, PipelineRequestedV4, _same)
REGISTRY.register(PIPELINE_REQUESTED, 5, PipelineRequestedV5, _same)
# Version 1 of the operator requests had no order; read as the first request of their pipeline.
REGISTRY.register(PIPELINE_CANCEL_REQUESTED, 1, PipelineCancelRequestedV1)
REGISTRY.register(
    PIPELINE_CANCEL_REQUESTED,
    2,
    PipelineCancelRequested,
    lambda data: {**data, "operation": 1, "reason": data["reason"][:500] or "canceled"},
)
REGISTRY.register(PIPELINE_RETRY_REQUESTED, 1, PipelineRetryRequestedV1)
REGISTRY.register(PIPELINE_RETRY_REQUESTED, 2, PipelineRetryRequested, lambda data: {**data, "operation": 1})
REGISTRY.register(OUTBOX_REPUBLISH_REQUESTED, 1, OutboxRepublishRequested)
for _stage in Stage:
    REGISTRY.register(stage_event(_stage, "started"), 1, StageStartedV1)
    REGISTRY.register(stage_event(_stage, "started"), 2, StageStarted, lambda data: {**data, "worker": None})
    REGISTRY.register(stage_event(_stage, "retrying"), 1, StageRetrying)
    REGISTRY.register(stage_event(_stage, "completed"), 1, _COMPLETED_V1[_stage])
    REGISTRY.register(stage_event(_stage, "completed"), 2, _COMPLETED_V2[_stage], _same)
    REGISTRY.register(stage_event(_stage, "failed"), 1, StageFailed)
    REGISTRY.register(stage_event(_stage, "canceled"), 1, StageCanceled)
    REGISTRY.register(provider_called_back(_stage), 1, ProviderCalledBack)
# Version 3 of song.completed times every syllable; a version-2 line reads as one whose syllables are untold.
REGISTRY.register(stage_event(Stage.SONG, "completed"), 3, SongCompletedV3, _same)
# Then every completed event names the brief's photos (lyric and video v3, song v4); an older one names none.
_COMPLETED_V3: dict[Stage, type[Payload]] = {
    Stage.LYRIC: LyricCompletedV3,
    Stage.SONG: SongCompletedV4,
    Stage.VIDEO: VideoCompletedV3,
}
for _stage, _version in ((Stage.LYRIC, 3), (Stage.SONG, 4), (Stage.VIDEO, 3)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED_V3[_stage], _same)
# Then a brief may name photos by URL (lyric and video v4, song v5), and song.completed tells the song's bars; an
# older event names uploads only and tells no bars.
for _stage, _version in ((Stage.LYRIC, 4), (Stage.SONG, 5), (Stage.VIDEO, 4)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED_V4[_stage], _same)
# Then video.completed (v5) tells the photos named by URL that the stage fetched and kept; an older one tells none.
REGISTRY.register(
    stage_event(Stage.VIDEO, "completed"), 5, VideoCompletedV5, lambda data: {**data, "fetched_photos": []}
)
# Then the brief's uploaded photos carry the gateway's seal (pipeline.requested v5 above, lyric v5, song v6, video v6);
# an older event's carry none.
_COMPLETED_V5: dict[Stage, type[Payload]] = {
    Stage.LYRIC: LyricCompletedV6,
    Stage.SONG: SongCompletedV7,
    Stage.VIDEO: VideoCompletedV7,
}
for _stage, _version in ((Stage.LYRIC, 5), (Stage.SONG, 6), (Stage.VIDEO, 6)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED_V5[_stage], _same)
# Then each stage keeps its files in its own place (lyric v6, song v7, video v7; `artifact_place`): the same shape,
# but a release before refuses such a file as another's, so an event naming one is written as this version at least.
for _stage, _version in ((Stage.LYRIC, 6), (Stage.SONG, 7), (Stage.VIDEO, 7)):
    REGISTRY.register(
        stage_event(_stage, "completed"), _version, _COMPLETED_V5[_stage], _same, needed=_kept_in_stage_place
    )
# Then video.completed (v8) names the video's poster; an older one names none.
REGISTRY.register(stage_event(Stage.VIDEO, "completed"), 8, VideoCompletedV8, lambda data: {**data, "poster": None})
# Then a brief may ask for several formats (pipeline.requested v6, lyric v7, song v8), and video.completed (v9) names
# each one's video and poster; an older event's brief asks for its orientation's format alone.
REGISTRY.register(PIPELINE_REQUESTED, 6, PipelineRequestedV6, _same)
_COMPLETED: dict[Stage, type[Payload]] = {
    Stage.LYRIC: LyricCompleted,
    Stage.SONG: SongCompleted,
    Stage.VIDEO: VideoCompleted,
}
for _stage, _version in ((Stage.LYRIC, 7), (Stage.SONG, 8), (Stage.VIDEO, 9)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED[_stage], _same)
# Then a pipeline may ask for a review of its lyrics (pipeline.requested v7): the lyric stage drafts, a person decides
# (pipeline.review_decided), and the stage goes on; an older pipeline.requested asks for none.
REGISTRY.register(PIPELINE_REQUESTED, 7, PipelineRequested, _same)
REGISTRY.register(stage_event(Stage.LYRIC, "drafted"), 1, LyricDrafted)
REGISTRY.register(stage_event(Stage.LYRIC, "review_expired"), 1, StageReviewExpired)
REGISTRY.register(PIPELINE_REVIEW_DECIDED, 1, PipelineReviewDecided)
# Then a pipeline may remake another from one of its stages on (pipeline.requested v7 above, lyric v8, song v9): the
# stages before it reuse their output of the other; an event of a pipeline that is not a remake is written as before.
for _stage, _version in ((Stage.LYRIC, 8), (Stage.SONG, 9)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED[_stage], _same, needed=_remade)
# Then the stages take their turns fairly across tenants (pipeline.requested v8 tells whose work a pipeline is, lyric
# v9 and song v10 pass it on), and every event that ends an attempt tells the requests for work it sent its provider
# (lyric v9, song v10, video v10; retrying, failed and canceled v2; lyric.drafted v2), which the gateway meters. An
# event with neither is written as before.
REGISTRY.register(PIPELINE_REQUESTED, 8, PipelineRequested, _same, needed=_shared_or_metered)
for _stage, _version in ((Stage.LYRIC, 9), (Stage.SONG, 10), (Stage.VIDEO, 10)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED[_stage], _same, needed=_shared_or_metered)
_ENDS: tuple[tuple[StageFact, type[Payload]], ...] = (
    ("retrying", StageRetrying),
    ("failed", StageFailed),
    ("canceled", StageCanceled),
)
for _stage in STAGE_ORDER:
    for _fact, _model in _ENDS:
        REGISTRY.register(stage_event(_stage, _fact), 2, _model, _same, needed=_shared_or_metered)
REGISTRY.register(stage_event(Stage.LYRIC, "drafted"), 2, LyricDrafted, _same, needed=_shared_or_metered)
