"""Composition root of the lyric service: reacts to pipeline.requested, writes lyrics."""

from __future__ import annotations

import pathlib
from typing import Literal, Self

from castad_contracts import events
from castad_runtime import artifacts, cli, settings
from castad_runtime.stage import cancellation, http, repository, runner
from castad_runtime.stage import service as stage_service
from pydantic import Field, SecretStr, model_validator
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
    openai_api_key_file: pathlib.Path | None = Field(
        default=None, description="a file holding the API key, read at every call (a mounted Secret can rotate)"
    )
    openai_model: str = Field(default="gpt-4o-mini", min_length=1, description="the model to ask")
    openai_timeout_s: float = Field(default=60.0, gt=0, description="longest wait for one answer")
    openai_max_answer_bytes: int = Field(default=1_000_000, ge=1024, description="a larger answer is refused")

    @model_validator(mode="after")
    def _key_for_openai(self) -> Self:
        if self.provider == "openai":
            settings.check_key(self, "openai_api_key")
            settings.check_provider_url(self, "openai_base_url")
        return self


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
        key = http.Credential(config.openai_api_key, config.openai_api_key_file)
        client = http.HttpProvider(
            "the Chat Completions server",
            config.openai_base_url,
            config.openai_timeout_s,
            config.openai_max_answer_bytes,
            headers=key.bearer,
            allow_private=config.allow_private,
        )
        return chat.ChatLyricProvider(client, config.openai_model)
    return provider.LocalLyricProvider()


def make_work(config: LyricSettings) -> runner.Work:
    writer = make_writer(config)
    store = artifacts.make_store(config)

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> runner.Output:
        request = events.PipelineRequested.model_validate(job.input)
        lyrics = writer.write(request.brief, seed=job.pipeline_id, cancel=cancel)
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
