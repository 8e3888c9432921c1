"""Composition root of the lyric service: reacts to pipeline.requested, writes lyrics."""

from __future__ import annotations

import pathlib

from castad_contracts import events
from castad_runtime import artifacts, cli, settings
from castad_runtime.stage import cancellation, repository, runner
from castad_runtime.stage import service as stage_service
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from castad_lyric import instant, provider

MIGRATIONS = pathlib.Path(__file__).parent / "migrations"


class LyricSettings(stage_service.StageSettings):
    model_config = SettingsConfigDict(env_prefix="CASTAD_LYRIC_", extra="ignore", frozen=True)

    database_url: str = Field(default=settings.database_url_default("lyric"), pattern=settings.POSTGRES_URL)


def render_text(lyrics: events.Lyrics) -> str:
    parts = [lyrics.title, ""]
    for section in lyrics.sections:
        parts.append(f"[{section.kind}]")
        parts.extend(section.lines)
        parts.append("")
    return "\n".join(parts)


def make_work(config: stage_service.StageSettings) -> runner.Work:
    writer: provider.LyricProvider = (
        instant.InstantLyricProvider() if config.provider == "instant" else provider.LocalLyricProvider()
    )
    store = artifacts.ArtifactStore(config.artifacts_dir)

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> runner.Output:
        request = events.PipelineRequested.model_validate(job.input)
        lyrics = writer.write(request.brief, seed=job.pipeline_id)
        cancel.check()
        with store.scratch(job.pipeline_id, events.Stage.LYRIC, job.attempts, ".txt") as scratch:
            scratch.write_text(render_text(lyrics), encoding="utf-8")
            artifact = store.keep(scratch, job.pipeline_id, events.Stage.LYRIC, "text/plain; charset=utf-8")
        return runner.Output(artifact, {"lyrics": lyrics})

    return work


DEFINITION = stage_service.StageDefinition(
    stage=events.Stage.LYRIC,
    trigger=events.PIPELINE_REQUESTED,
    completed_model=events.LyricCompleted,
    make_work=make_work,
)


def run(config: LyricSettings) -> None:
    stage_service.run(DEFINITION, config)


app = cli.service_app("lyric", LyricSettings, run, MIGRATIONS)
