"""Composition root of the video service: reacts to song.completed, renders the MP4."""

from __future__ import annotations

import contextlib
import pathlib

from castad_contracts import events
from castad_runtime import artifacts, cli, settings
from castad_runtime.stage import cancellation, errors, repository, runner
from castad_runtime.stage import service as stage_service
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from castad_video import instant, provider

MIGRATIONS = pathlib.Path(__file__).parent / "migrations"


class VideoSettings(stage_service.StageSettings):
    model_config = SettingsConfigDict(env_prefix="CASTAD_VIDEO_", extra="ignore", frozen=True)

    database_url: str = Field(default=settings.database_url_default("video"), pattern=settings.POSTGRES_URL)
    short_side: int = Field(default=720, ge=144, le=2160, description="pixels of the video's shorter side")
    fps: int = Field(default=24, ge=1, le=60, description="frame rate of the MP4")
    font_path: pathlib.Path | None = Field(
        default=None, description="caption font (TTF, OTF); default: the first installed one that draws the language"
    )
    ffmpeg: str | None = Field(default=None, description="ffmpeg binary (default: the one from imageio-ffmpeg)")


def make_work(config: VideoSettings) -> runner.Work:
    renderer: provider.VideoProvider
    if config.provider == "instant":
        renderer = instant.InstantVideoProvider(ffmpeg=config.ffmpeg)
    else:
        renderer = provider.LocalVideoProvider(
            short_side=config.short_side,
            fps=config.fps,
            font_path=config.font_path,
            ffmpeg=config.ffmpeg,
        )
    store = artifacts.make_store(config)

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> runner.Output:
        done = events.SongCompleted.model_validate(job.input)
        with contextlib.ExitStack() as files:
            try:
                song_path = files.enter_context(store.local_copy(done.artifact))
            except artifacts.ArtifactMissing as error:
                raise errors.PermanentProviderError("song_unreachable", str(error)) from None
            scratch = files.enter_context(store.scratch(job.pipeline_id, events.Stage.VIDEO, job.attempts, ".mp4"))
            video = renderer.render(
                done.brief, done.lyrics, done.timed_lines, song_path, scratch, seed=job.pipeline_id, cancel=cancel
            )
            artifact = store.keep(scratch, job.pipeline_id, events.Stage.VIDEO, "video/mp4")
        return runner.Output(artifact, {"width": video.width, "height": video.height})

    return work


DEFINITION = stage_service.StageDefinition[VideoSettings](
    stage=events.Stage.VIDEO,
    trigger=events.stage_event(events.Stage.SONG, "completed"),
    completed_model=events.VideoCompleted,
    make_work=make_work,
)


def run(config: VideoSettings) -> None:
    stage_service.run(DEFINITION, config)


app = cli.service_app("video", VideoSettings, run, MIGRATIONS)
