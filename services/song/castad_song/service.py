"""Composition root of the song service: reacts to lyric.completed, sings the lyrics."""

from __future__ import annotations

import pathlib
from typing import Literal

from castad_contracts import events
from castad_runtime import artifacts, cli, settings
from castad_runtime.stage import cancellation, outcomes, remote, repository, runner
from castad_runtime.stage import service as stage_service
from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from castad_song import instant, provider, suno

MIGRATIONS = pathlib.Path(__file__).parent / "migrations"


class SongSettings(stage_service.LinkingStageSettings):
    model_config = SettingsConfigDict(env_prefix="CASTAD_SONG_", extra="ignore", frozen=True)

    database_url: str = Field(default=settings.database_url_default("song"), pattern=settings.POSTGRES_URL)
    provider: Literal["local", "instant", "suno"] = Field(  # type: ignore[assignment]  # one more than a stage's
        default="local",
        description="`local` sings offline; `instant` writes a tiny WAV at once (benchmarks); `suno` asks a Suno"
        " music API shaped as sunoapi.org's v1 (CASTAD_SONG_SUNO_*), submit then poll",
    )
    voice: Literal["female", "male", "off"] = Field(
        default="female",
        description="who sings with the `local` provider: `female` at the melody's pitch, `male` an octave below, or"
        " `off` for the instrumental alone; a voice that cannot sing (eSpeak NG missing) stops the service at start",
    )
    suno_base_url: str = Field(
        default="https://api.sunoapi.org", pattern=r"^https?://", description="the music API's base URL"
    )
    suno_api_key: SecretStr | None = Field(
        default=None, description="its API key (or CASTAD_SONG_SUNO_API_KEY_FILE); never logged"
    )
    suno_api_key_file: stage_service.ProviderKeyFile = None
    suno_model: str = Field(default="V4_5", min_length=1, description="the model to sing with")
    suno_timeout_s: stage_service.ProviderTimeout = 30.0
    suno_max_answer_bytes: stage_service.ProviderMaxAnswer = 1_000_000
    # sunoapi.org takes 20 requests per 10 s (docs/providers.md): a burst of 5 and 1 a second stay under it
    # (15 in any 10 s) from the first call, with room for the look-up a resubmission makes first.
    quota_rate_per_s: float = Field(
        default=1.0, gt=0, description="calls per second to the music API, across every worker of the service"
    )
    quota_burst: float = Field(default=5.0, ge=1, description="calls that may go at once after a quiet spell")


def make_suno_work(config: SongSettings) -> runner.Work:
    client = config.provider_client("the music API", suno.classify)
    store = artifacts.make_store(config)

    def fetch(job: repository.Job, song: remote.Finished, cancel: cancellation.Cancellation) -> outcomes.Output:
        done = job.trigger(events.LyricCompleted)
        artifact = remote.keep_result(
            store,
            job,
            events.Stage.SONG,
            song,
            cancel,
            media_types=("audio/",),
            max_bytes=config.download_max_bytes,
            timeout_s=config.suno_timeout_s * 4,
            allow_private=config.allow_private,
        )
        duration_s = song.details["duration_s"]
        timed = suno.spread(done.lyrics, duration_s)
        return outcomes.Output(artifact, {"lyrics": done.lyrics, "timed_lines": timed, "song_duration_s": duration_s})

    api = suno.SunoApi(client, config.suno_model)
    return remote.work(api, config.poll_schedule(), config.callback_url(events.Stage.SONG), fetch)


def make_work(config: SongSettings) -> runner.Work:
    if config.provider == "suno":
        return make_suno_work(config)
    composer: provider.SongProvider = (
        instant.InstantSongProvider()
        if config.provider == "instant"
        else provider.LocalSongProvider(singer=None if config.voice == "off" else config.voice)
    )
    store = artifacts.make_store(config)

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        done = job.trigger(events.LyricCompleted)
        with store.scratch(job.pipeline_id, events.Stage.SONG, job.attempts, ".wav") as scratch:
            song = composer.compose(done.brief, done.lyrics, scratch, seed=job.pipeline_id, cancel=cancel)
            artifact = store.keep(scratch, job.pipeline_id, events.Stage.SONG, "audio/wav")
        details = {
            "lyrics": done.lyrics,
            "timed_lines": song.timed_lines,
            "song_duration_s": song.duration_s,
            "bars_s": song.bars_s,
        }
        return outcomes.Output(artifact, details)

    return work


DEFINITION = stage_service.StageDefinition[SongSettings](
    stage=events.Stage.SONG,
    completed_model=events.SongCompleted,
    make_work=make_work,
)


def run(config: SongSettings) -> None:
    stage_service.run(DEFINITION, config)


app = cli.service_app("song", SongSettings, run, MIGRATIONS)
