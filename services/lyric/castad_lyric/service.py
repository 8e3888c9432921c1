"""Composition root of the lyric service: reacts to pipeline.requested, writes lyrics."""

from __future__ import annotations

import pathlib
from typing import Literal

from castad_contracts import events
from castad_runtime import artifacts, cli, settings
from castad_runtime.stage import cancellation, repository, runner
from castad_runtime.stage import service as stage_service
from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from castad_lyric import chat, instant, provider

MIGRATIONS = pathlib.Path(__file__).parent / "migrations"


class LyricSettings(stage_service.StageSettings):
    model_config = SettingsConfigDict(env_prefix="CASTAD_LYRIC_", extra="ignore", frozen=True)

    database_url: str = Field(default=settings.database_url_default("lyric"), pattern=settings.POSTGRES_URL)
    provider: Literal["local", "instant", "openai"] = Field(  # type: ignore[assignment]  # one more than a stage's
        default="local",
        description="`local` writes lyrics offline; `instant` one line at once (benchmarks); `openai` asks an"
        " OpenAI-compatible Chat Completions server (CASTAD_LYRIC_OPENAI_*)",
    )
    openai_base_url: str = Field(
        default="https://api.openai.com/v1", pattern=r"^https?://", description="the Chat Completions server's base URL"
    )
    openai_api_key: SecretStr | None = Field(
        default=None, description="its API key (or CASTAD_LYRIC_OPENAI_API_KEY_FILE); never logged"
    )
    openai_api_key_file: stage_service.ProviderKeyFile = None
    openai_model: str = Field(default="gpt-4o-mini", min_length=1, description="the model to ask")
    openai_timeout_s: stage_service.ProviderTimeout = 60.0
    openai_max_answer_bytes: stage_service.ProviderMaxAnswer = 1_000_000


def render_text(lyrics: events.Lyrics) -> str:
    parts = [lyrics.title, ""]
    for section in lyrics.sections:
        parts.append(f"[{section.kind}]")
        parts.extend(section.lines)
        parts.append("")
    return "\n".join(parts)


def make_writer(config: LyricSettings) -> provider.LyricProvider:
    if config.provider == "instant":
        return instant.InstantLyricProvider()
    if config.provider == "openai":
        return chat.ChatLyricProvider(config.provider_client("the Chat Completions server"), config.openai_model)
    return provider.LocalLyricProvider()


def make_work(config: LyricSettings) -> runner.Work:
    writer = make_writer(config)
    store = artifacts.make_store(config)

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> runner.Output:
        request = job.trigger(events.PipelineRequested)
        lyrics = writer.write(request.brief, seed=job.pipeline_id, cancel=cancel, attempt=job.attempts)
        cancel.check()
        with store.scratch(job.pipeline_id, events.Stage.LYRIC, job.attempts, ".txt") as scratch:
            scratch.write_text(render_text(lyrics), encoding="utf-8")
            artifact = store.keep(scratch, job.pipeline_id, events.Stage.LYRIC, "text/plain; charset=utf-8")
        return runner.Output(artifact, {"lyrics": lyrics})

    return work


DEFINITION = stage_service.StageDefinition[LyricSettings](
    stage=events.Stage.LYRIC,
    completed_model=events.LyricCompleted,
    make_work=make_work,
)


def run(config: LyricSettings) -> None:
    stage_service.run(DEFINITION, config)


app = cli.service_app("lyric", LyricSettings, run, MIGRATIONS)
