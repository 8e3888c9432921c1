"""What the stages tell of a pipeline's jobs: an attempt started, retrying, failed, completed, canceled, drafted."""

from __future__ import annotations

import datetime as dt
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from castad_contracts import brief as brief_
from castad_contracts.events.common import PROVIDER_CALLS, REMAKE, SHARE, Artifact, Payload, Remake, Share, Stage
from castad_contracts.events.lyrics import Lyrics, TimedLine, TimedLineV2


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


class StageCanceled(Payload):
    """A stage stopped its job for a cancel request, or, having none yet, will never start one."""

    stage: Stage
    job_id: str
    attempt: int = Field(ge=0, description="attempts the job had started (0: canceled before it ever ran)")
    operation: int = Field(ge=1, description="the cancel request this answers")
    reason: str
    canceled_at: dt.datetime
    provider_calls: int | None = PROVIDER_CALLS


class ProviderCalledBack(Payload):
    """A stage's provider called the gateway back about the pipeline's work: its next poll is due now."""

    stage: Stage
    received_at: dt.datetime
