"""Composition root of the lyric service: reacts to pipeline.requested, writes lyrics."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Literal

from castad_contracts import events
from castad_runtime import artifacts, cli, settings
from castad_runtime.stage import cancellation, outcomes, repository, reviews, runner
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


def make_writer(config: LyricSettings) -> provider.LyricProvider:
    if config.provider == "instant":
        return instant.InstantLyricProvider()
    if config.provider == "openai":
        return chat.ChatLyricProvider(config.provider_client("the Chat Completions server"), config.openai_model)
    return provider.LocalLyricProvider()


def make_work(config: LyricSettings) -> runner.Work:
    writer = make_writer(config)
    keep = make_keep(config)

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output | outcomes.Drafted:
        request = job.trigger(events.PipelineRequested)
        # A review that asked for a new draft: written from another seed, and told what to change if it said.
        round_, note = job.next_round, (job.review or {}).get("note")
        seed = job.pipeline_id if round_ == 0 else f"{job.pipeline_id}/{round_}"
        lyrics = writer.write(request.brief, seed=seed, cancel=cancel, attempt=job.attempts, note=note)
        cancel.check()
        output = keep(job.pipeline_id, lyrics, job.attempts)
        asked = request.review
        return outcomes.Drafted(output, asked) if asked is not None and asked.lyrics else output

    return work


def make_keep(config: LyricSettings) -> Callable[[str, events.Lyrics, int], outcomes.Output]:
    """How the stage keeps lyrics as its output: their text as a file (`Lyrics.text`), and the lyrics themselves."""
    store = artifacts.make_store(config)

    def keep(pipeline_id: str, lyrics: events.Lyrics, attempt: int = 0) -> outcomes.Output:
        with store.scratch(pipeline_id, events.Stage.LYRIC, attempt, ".txt") as scratch:
            scratch.write_text(lyrics.text(), encoding="utf-8")
            artifact = store.keep(scratch, pipeline_id, events.Stage.LYRIC, "text/plain; charset=utf-8")
        return outcomes.Output(artifact, {"lyrics": lyrics})

    return keep


def make_edit(config: LyricSettings) -> reviews.Edit:
    """A person's edit of a draft is kept as the writer's lyrics are."""
    keep = make_keep(config)
    return lambda pipeline_id, lyrics: keep(pipeline_id, lyrics, 0)


DEFINITION = stage_service.StageDefinition[LyricSettings](
    stage=events.Stage.LYRIC,
    completed_model=events.LyricCompleted,
    make_work=make_work,
    make_edit=make_edit,
)


def run(config: LyricSettings) -> None:
    stage_service.run(DEFINITION, config)


app = cli.service_app("lyric", LyricSettings, run, MIGRATIONS)
