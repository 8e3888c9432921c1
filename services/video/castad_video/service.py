"""Composition root of the video service: reacts to song.completed, renders the MP4."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import pathlib
from typing import Annotated, Literal, Self

from castad_contracts import brief, codes, events
from castad_runtime import artifacts, cli, links, settings
from castad_runtime.stage import cancellation, errors, outcomes, remote, repository, runner
from castad_runtime.stage import service as stage_service
from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from castad_video import creatomate, ffmpeg, instant, photos, provider

MIGRATIONS = pathlib.Path(__file__).parent / "migrations"
log = logging.getLogger(__name__)


class VideoSettings(stage_service.LinkingStageSettings):
    model_config = SettingsConfigDict(env_prefix="CASTAD_VIDEO_", extra="ignore", frozen=True)

    database_url: str = Field(default=settings.database_url_default("video"), pattern=settings.POSTGRES_URL)
    short_side: int = Field(default=720, ge=144, le=2160, description="pixels of the video's shorter side")
    fps: int = Field(default=24, ge=1, le=60, description="frame rate of the MP4")
    font_path: pathlib.Path | None = Field(
        default=None, description="caption font (TTF, OTF); default: the first installed one that draws the language"
    )
    ffmpeg: str | None = Field(default=None, description="ffmpeg binary (default: the one from imageio-ffmpeg)")
    provider: Literal["local", "instant", "creatomate"] = Field(  # type: ignore[assignment]  # one more than a stage's
        default="local",
        description="`local` renders offline with ffmpeg; `instant` a tiny MP4 at once (benchmarks); `creatomate`"
        " asks Creatomate's render API v2 (CASTAD_VIDEO_CREATOMATE_*), submit then poll",
    )
    creatomate_base_url: str = Field(
        default="https://api.creatomate.com", pattern=r"^https?://", description="the render API's base URL"
    )
    creatomate_api_key: SecretStr | None = Field(
        default=None, description="its API key (or CASTAD_VIDEO_CREATOMATE_API_KEY_FILE); never logged"
    )
    creatomate_api_key_file: stage_service.ProviderKeyFile = None
    creatomate_template_id: str | None = Field(
        default=None, min_length=1, description="the template rendered (its elements: see docs/providers.md)"
    )
    creatomate_format_templates: dict[brief.Format, Annotated[str, Field(min_length=1)]] = Field(
        default={},
        description='the template of each format a brief may ask for, as JSON ({"1:1": "<template id>", ...}), each of'
        " that format's frame size; a format without one is rendered from CASTAD_VIDEO_CREATOMATE_TEMPLATE_ID if"
        " that template has its shape, else the brief fails for good (format_unsupported)",
    )
    creatomate_timeout_s: stage_service.ProviderTimeout = 30.0
    creatomate_max_answer_bytes: stage_service.ProviderMaxAnswer = 1_000_000
    # Creatomate takes 30 requests per 10 s (docs/providers.md): a burst of 5 and 2 a second stay under it
    # (25 in any 10 s) from the first call, with room for the look-up a resubmission makes first. A claim of a brief
    # in several formats makes a request per format (docs/providers.md, "Formats").
    quota_rate_per_s: float = Field(
        default=2.0, gt=0, description="calls per second to the render API, across every worker of the service"
    )
    quota_burst: float = Field(default=5.0, ge=1, description="calls that may go at once after a quiet spell")
    allow_private: bool = Field(
        default=False,
        description="let calls to the render API, downloads of its results and the brief's photos named by URL go"
        " to private, loopback and link-local addresses and over plain http (local fakes and tests only; off:"
        " https to public addresses, checked after DNS and on redirects)",
    )
    photo_max_bytes: int = Field(
        default=10_485_760,
        ge=1024,
        description="a photo the brief names by URL larger than this is refused (as CASTAD_API_IMAGE_MAX_BYTES"
        " refuses an upload)",
    )
    photo_max_pixels: int = Field(
        default=40_000_000,
        ge=1,
        le=89_000_000,
        description="a photo named by URL declaring more pixels (width x height) is refused before any is decoded",
    )
    photo_timeout_s: float = Field(
        default=30.0, gt=0, le=600, description="longest wait for the whole of a photo named by URL"
    )
    link_secret: SecretStr | None = Field(
        default=None,
        min_length=32,
        description="this stage's key for the gateway's links that its render API uses without an API key"
        " (callbacks, the song and the photos it fetches), derived from the gateway's CASTAD_API_LINK_SECRET:"
        " `python -m castad_api link-secrets` prints it; with it the stage also checks the gateway's seal of each"
        " photo a brief names, and uses none whose seal does not hold (unset: photos are not checked)",
    )
    accept_unsealed_photos_before: dt.datetime | None = Field(
        default=None,
        description="with CASTAD_VIDEO_LINK_SECRET, use photos that carry no seal of the gateway in the jobs this stage"
        " began before this time (ISO 8601): those of pipelines a gateway of a release before seals accepted, and"
        " their retries. Set it to when the gateway was upgraded; unset: none is used. A seal that does not hold is"
        " refused either way",
    )

    def photo_limits(self) -> photos.Limits:
        return photos.Limits(
            max_bytes=self.photo_max_bytes,
            max_pixels=self.photo_max_pixels,
            timeout_s=self.photo_timeout_s,
            allow_private=self.allow_private,
        )

    @model_validator(mode="after")
    def _creatomate_needs(self) -> Self:
        if self.provider != "creatomate":
            return self
        if self.creatomate_template_id is None:
            raise ValueError("provider creatomate needs CASTAD_VIDEO_CREATOMATE_TEMPLATE_ID")
        if self.artifacts_store == "volume" and self.gateway_url is None:
            raise ValueError(
                "provider creatomate fetches the song from the gateway (CASTAD_VIDEO_GATEWAY_URL) unless the"
                " artifacts are in a bucket (CASTAD_ARTIFACTS_STORE=s3)"
            )
        return self


def checked_photos(
    config: VideoSettings, done: events.SongCompleted, begun: dt.datetime | None = None
) -> tuple[brief.Photo | brief.PhotoLink, ...]:
    """The brief's photos, each one's seal checked: the gateway's, for this pipeline.

    The lyric and song stages pass the brief on and could name another pipeline's (another tenant's) upload in it,
    or a URL of the store where one is; with the video stage's key (CASTAD_VIDEO_LINK_SECRET) no photo is used whose
    seal does not hold (for good, `photo_not_sealed`), but an unsealed one in a job `begun` before the cut-off
    (CASTAD_VIDEO_ACCEPT_UNSEALED_PHOTOS_BEFORE). Without the key nothing can be checked, as before seals.
    """
    for index, photo in enumerate(done.brief.photos):
        _check_seal(config, done, photo, f"photo {index + 1}", begun)
    return done.brief.photos


def checked_logo(
    config: VideoSettings, done: events.SongCompleted, begun: dt.datetime | None = None
) -> brief.Photo | None:
    """The brief's brand's logo, if it has one, its seal checked as a photo's is (`checked_photos`), never unsealed."""
    logo = done.brief.brand.logo if done.brief.brand is not None else None
    if logo is not None:  # no cut-off: every gateway that names a logo seals it
        _check_seal(config, done, logo, "the brand's logo", None)
    return logo


def _check_seal(
    config: VideoSettings,
    done: events.SongCompleted,
    photo: brief.Photo | brief.PhotoLink,
    what: str,
    begun: dt.datetime | None,
) -> None:
    secret, cutoff = config.link_secret, config.accept_unsealed_photos_before
    if secret is None or photo.seal is None and cutoff is not None and begun is not None and begun < cutoff:
        return
    if not links.seal_holds(secret, done.pipeline_id, photo):
        said = "carries no seal" if photo.seal is None else "carries a seal that does not hold"
        named = f"image {photo.id}" if isinstance(photo, brief.Photo) else photo.url
        raise errors.PermanentProviderError(
            codes.ErrorCode.PHOTO_NOT_SEALED, f"{what} ({named}) {said}: the gateway did not name it for this pipeline"
        )


def song_url(config: VideoSettings, store: artifacts.ArtifactStore, done: events.SongCompleted) -> str:
    """Where the render API fetches the song: a presigned URL of the bucket, or a signed link of the gateway.

    Either valid while a render may wait in the provider's queue and run (its give-up time), and a margin."""
    try:
        served = store.serve(done.artifact, done.pipeline_id, events.Stage.SONG, config.link_valid_s())
    except artifacts.ArtifactMissing as error:
        raise errors.PermanentProviderError(codes.ErrorCode.SONG_UNREACHABLE, str(error)) from None
    if isinstance(served, str):
        return served
    assert config.gateway_url is not None and config.link_secret is not None
    path = f"/v1/links/pipelines/{done.pipeline_id}/artifacts/song"
    return links.sign(config.gateway_url, path, config.link_secret, links.Purpose.ARTIFACT, config.link_valid_s())


def photo_urls(
    config: VideoSettings, store: artifacts.ArtifactStore, done: events.SongCompleted, begun: dt.datetime | None = None
) -> list[str]:
    """Where the render API fetches each of the brief's photos.

    An upload at a presigned URL of the bucket or a signed link of the gateway that opens that one image; a photo
    named by an https URL at that URL (the render API fetches it itself; an http one, which only a test setting
    lets a brief name, it is not sent).
    """
    urls = []
    for photo in checked_photos(config, done, begun):
        if isinstance(photo, brief.PhotoLink):
            if not photo.url.lower().startswith("https://"):
                raise errors.PermanentProviderError(
                    codes.ErrorCode.PHOTO_REFUSED, f"the render API is given photos by https URL only, not {photo.url}"
                )
            urls.append(photo.url)
            continue
        urls.append(_upload_url(config, store, done, photo))
    return urls


def _upload_url(
    config: VideoSettings, store: artifacts.ArtifactStore, done: events.SongCompleted, upload: brief.Photo
) -> str:
    """A presigned URL of the bucket for an upload, or a signed link of the gateway that opens that one image."""
    try:
        served = store.serve_image(upload, config.link_valid_s())
    except artifacts.ArtifactMissing as error:
        raise errors.PermanentProviderError(codes.ErrorCode.PHOTO_UNREACHABLE, str(error)) from None
    if isinstance(served, str):
        return served
    assert config.gateway_url is not None and config.link_secret is not None
    path = f"/v1/links/pipelines/{done.pipeline_id}/photos/{upload.id}"
    return links.sign(config.gateway_url, path, config.link_secret, links.Purpose.PHOTO, config.link_valid_s())


def logo_url(
    config: VideoSettings, store: artifacts.ArtifactStore, done: events.SongCompleted, begun: dt.datetime | None = None
) -> str | None:
    """Where the render API fetches the brand's logo, as an upload among the photos (`photo_urls`); None: no logo."""
    logo = checked_logo(config, done, begun)
    return None if logo is None else _upload_url(config, store, done, logo)


def output(renders: list[events.Render], done: events.SongCompleted, **details: object) -> outcomes.Output:
    """What the stage made of `done`, as video.completed tells it.

    The first format's file, size and poster, then the others, and how long each lasts (its song's length)."""
    first, *more = renders
    size = {"width": first.width, "height": first.height, "duration_s": done.song_duration_s}
    return outcomes.Output(first.artifact, {**size, "poster": first.poster, "more_formats": tuple(more), **details})


def make_creatomate_work(config: VideoSettings) -> runner.Work:
    assert config.creatomate_template_id is not None
    client = config.provider_client("the render API")
    store = artifacts.make_store(config)

    def kept(
        job: repository.Job, shape: brief.Format, video: remote.Finished, cancel: cancellation.Cancellation
    ) -> events.Render:
        """A render's MP4 kept, with its snapshot as its poster if the template takes one."""
        artifact = remote.keep_result(
            store,
            job,
            events.Stage.VIDEO,
            video,
            cancel,
            media_types=("video/mp4",),
            max_bytes=config.download_max_bytes,
            timeout_s=config.creatomate_timeout_s * 4,
            allow_private=config.allow_private,
        )
        poster = None
        if snapshot := video.details.get("snapshot_url"):  # a still of the render, if its template takes one
            try:
                poster = remote.keep_result(
                    store,
                    job,
                    events.Stage.VIDEO,
                    remote.Finished(snapshot),
                    cancel,
                    media_types=("image/jpeg",),
                    max_bytes=config.photo_max_bytes,
                    timeout_s=config.creatomate_timeout_s,
                    allow_private=config.allow_private,
                )
            except errors.ProviderError as error:  # the video is made and kept: it goes on without a poster
                log.warning("pipeline %s: the render's snapshot is not kept as its poster: %s", job.pipeline_id, error)
        width, height = provider.frame_size(shape, config.short_side)
        width, height = int(video.details.get("width", width)), int(video.details.get("height", height))
        return events.Render(format=shape, artifact=artifact, width=width, height=height, poster=poster)

    def fetch(job: repository.Job, video: remote.Finished, cancel: cancellation.Cancellation) -> outcomes.Output:
        done = job.trigger(events.SongCompleted)
        told = video.details.get("renders") or [{"format": done.brief.frames[0], "url": video.url, **video.details}]
        return output([kept(job, brief.Format(r["format"]), remote.Finished(r["url"], r), cancel) for r in told], done)

    api = creatomate.CreatomateApi(
        client,
        config.creatomate_template_id,
        lambda done: song_url(config, store, done),
        lambda done, begun: photo_urls(config, store, done, begun),
        config.creatomate_format_templates,
        config.provider_give_up_s,
        lambda done, begun: logo_url(config, store, done, begun),
    )
    work = remote.work(api, config.poll_schedule(), config.callback_url(events.Stage.VIDEO), fetch)
    return dataclasses.replace(work, readiness={"template": api.template_fits})


def make_work(config: VideoSettings) -> runner.Work:
    if config.link_secret is None:
        log.warning(
            "CASTAD_VIDEO_LINK_SECRET is not set: the gateway's seals of the photos briefs name are not checked, so a"
            " lyric or song stage could put another pipeline's photo in a video (docs/security.md)"
        )
    if config.provider == "creatomate":
        return make_creatomate_work(config)
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
    limits = config.photo_limits()

    def photo_copies(
        files: contextlib.ExitStack, job: repository.Job, done: events.SongCompleted, cancel: cancellation.Cancellation
    ) -> tuple[list[pathlib.Path], list[events.FetchedPhoto]]:
        """The files of the brief's photos, open until `files` closes, and those fetched by URL as kept.

        An upload is read from the store, a URL's fetched or kept by an earlier attempt; those fetched by URL are
        also returned as the completed event tells them.
        """
        paths, fetched = [], []
        for index, photo in enumerate(checked_photos(config, done, job.created_at)):
            if isinstance(photo, brief.PhotoLink):
                linked = files.enter_context(photos.linked_copy(store, job.pipeline_id, index, photo, limits, cancel))
                paths.append(linked.path)
                fetched.append(linked.photo)
            else:
                paths.append(files.enter_context(store.image_copy(photo)))
        return paths, fetched

    def rendered(
        job: repository.Job,
        done: events.SongCompleted,
        shape: brief.Format,
        song_path: pathlib.Path,
        paths: list[pathlib.Path],
        logo: pathlib.Path | None,
        cancel: cancellation.Cancellation,
    ) -> events.Render:
        """The video in one format and its poster, kept; as an earlier attempt kept them if it did.

        Each is kept as what made it: the renderer, its frame rate and the frame size (another setting makes it
        anew), so that an attempt after one that made some formats only makes the others."""
        width, height = renderer.frame(shape)
        made = f"{config.provider} {config.fps} fps {width}x{height}"
        video_key, poster_key = f"{made} video", f"{made} poster"
        earlier = store.made(job.pipeline_id, events.Stage.VIDEO, video_key, "video/mp4")
        earlier_poster = earlier and store.made(job.pipeline_id, events.Stage.VIDEO, poster_key, "image/jpeg")
        if earlier is not None and earlier_poster is not None:
            log.info(
                "pipeline %s: the %s video an earlier attempt made is taken, not made again", job.pipeline_id, shape
            )
            return events.Render(format=shape, artifact=earlier, width=width, height=height, poster=earlier_poster)
        with contextlib.ExitStack() as files:
            scratch = files.enter_context(
                store.scratch(job.pipeline_id, events.Stage.VIDEO, job.attempts, f".{shape.slug}.mp4")
            )
            video = renderer.render(
                done.brief,
                done.lyrics,
                done.timed_lines,
                song_path,
                scratch,
                seed=job.pipeline_id,
                cancel=cancel,
                photos=paths,
                bars_s=done.bars_s,
                shape=shape,
                logo=logo,
            )
            still = files.enter_context(
                store.scratch(job.pipeline_id, events.Stage.VIDEO, job.attempts, f".{shape.slug}.jpg")
            )
            ffmpeg.still(scratch, video.poster_s, still, cancel, config.ffmpeg)
            artifact = store.keep(scratch, job.pipeline_id, events.Stage.VIDEO, "video/mp4", made_as=video_key)
            poster = store.keep(still, job.pipeline_id, events.Stage.VIDEO, "image/jpeg", made_as=poster_key)
        return events.Render(format=shape, artifact=artifact, width=video.width, height=video.height, poster=poster)

    def work(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Output:
        done = job.trigger(events.SongCompleted)
        with contextlib.ExitStack() as files:
            try:
                song_path = files.enter_context(store.local_copy(done.artifact, job.pipeline_id, events.Stage.SONG))
            except artifacts.ArtifactMissing as error:
                raise errors.PermanentProviderError(codes.ErrorCode.SONG_UNREACHABLE, str(error)) from None
            logo = checked_logo(config, done, job.created_at)
            try:
                paths, fetched = photo_copies(files, job, done, cancel)
                logo_path = None if logo is None else files.enter_context(store.image_copy(logo))
            except artifacts.ArtifactMissing as error:
                raise errors.PermanentProviderError(codes.ErrorCode.PHOTO_UNREACHABLE, str(error)) from None
            renders = [rendered(job, done, shape, song_path, paths, logo_path, cancel) for shape in done.brief.frames]
        return output(renders, done, fetched_photos=tuple(fetched))

    return work


DEFINITION = stage_service.StageDefinition[VideoSettings](
    stage=events.Stage.VIDEO,
    completed_model=events.VideoCompleted,
    make_work=make_work,
)


def run(config: VideoSettings) -> None:
    stage_service.run(DEFINITION, config)


app = cli.service_app("video", VideoSettings, run, MIGRATIONS)
