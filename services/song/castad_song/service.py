"""Composition root of the song service: reacts to lyric.completed, sings the lyrics."""

from __future__ import annotations

import pathlib

from castad_contracts import events
from castad_runtime import artifacts, cli, settings
from castad_runtime.stage import cancellation, repository, runner
from castad_runtime.stage import service as stage_service
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from castad_song import instant, provider

MIGRATIONS = pathlib.Path(__file__).parent / "migrations"


class SongSettings(stage_service.StageSettings):
    model_config = SettingsConfigDict(env_prefix="CASTAD_SONG_", extra="ignore", frozen=True)

    database_url: str = Field(default=settings.database_url_default("song"), pattern=settings.POSTGRES_URL)


def make_work(config: stage_service.StageSettings) -> runner.Work:
    composer: provider.SongProvider = (
        instant.InstantSongProvider() if config.provider == "instant" else provider.LocalSongProvider()
    )
    store = artifacts.make_store(config)

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> runner.Output:
        done = events.LyricCompleted.model_validate(job.input)
        with store.scratch(job.pipeline_id, events.Stage.SONG, job.attempts, ".wav") as scratch:
            song = composer.compose(done.brief, done.lyrics, scratch, seed=job.pipeline_id, cancel=cancel)
            artifact = store.keep(scratch, job.pipeline_id, events.Stage.SONG, "audio/wav")
        details = {"lyrics": done.lyrics, "timed_lines": song.timed_lines, "song_duration_s": song.duration_s}
        return runner.Output(artifact, details)

    return work


DEFINITION = stage_service.StageDefinition(
    stage=events.Stage.SONG,
    trigger=events.stage_event(events.Stage.LYRIC, "completed"),
    completed_model=events.SongCompleted,
    make_work=make_work,
)


def run(config: SongSettings) -> None:
    stage_service.run(DEFINITION, config)


app = cli.service_app("song", SongSettings, run, MIGRATIONS)
