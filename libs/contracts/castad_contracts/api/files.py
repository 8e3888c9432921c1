"""Links to a pipeline's files: each stage's artifact, the fetched photos, the video's formats, the captions."""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, Field

from castad_contracts import brief, events


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
