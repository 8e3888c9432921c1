"""A pipeline's files: each stage's artifact, the video's formats and posters, its photos, the song's captions."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Annotated, Any

from castad_contracts import api, brief, events
from castad_runtime import artifacts
from fastapi import APIRouter, HTTPException, Path, status
from fastapi.responses import FileResponse, Response

from castad_api import (
    captions,
    deps,
    errors,
    records,
    repository,
    served,
)
from castad_api.deps import Gateway, GatewayDep, Reader
from castad_api.routes.common import LINK_ERRORS, SIGNED_LINK

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["pipelines"], responses={**deps.AUTH_ERRORS, **deps.UNREADABLE})


DELETED: dict[int | str, dict[str, Any]] = {
    410: {
        "model": api.Problem,
        "description": "retention deleted it (CASTAD_RETENTION_ARTIFACTS_S after its stage ended)",
    }
}


@router.get(
    "/pipelines/{pipeline_id}/artifacts/{stage}",
    response_class=FileResponse,
    responses={307: {"description": "a presigned URL of the object store"}, 404: {"model": api.Problem}, **DELETED},
)
def download_artifact(pipeline_id: uuid.UUID, stage: events.Stage, gw: GatewayDep, who: Reader) -> Response:
    """The file a stage produced, or (with an object store) a redirect to a presigned URL of it.

    410 once retention deleted it.
    """
    return _serve(gw, pipeline_id, stage, who.tenant_filter())


@router.get(
    "/links/pipelines/{pipeline_id}/artifacts/{stage}",
    response_class=FileResponse,
    tags=["providers"],
    responses={**LINK_ERRORS, **DELETED},
    dependencies=SIGNED_LINK,
)
def linked_artifact(pipeline_id: uuid.UUID, stage: events.Stage, gw: GatewayDep) -> Response:
    """A stage's file by a link a stage signed for a provider (the song a render API fetches)."""
    return _serve(gw, pipeline_id, stage, None)


@router.get(
    "/pipelines/{pipeline_id}/artifacts/video/poster",
    response_class=FileResponse,
    responses={307: {"description": "a presigned URL of the object store"}, 404: {"model": api.Problem}, **DELETED},
)
def download_poster(pipeline_id: uuid.UUID, gw: GatewayDep, who: Reader) -> Response:
    """The video's poster: a still (JPEG) of the moment it shows the business's name over the first photo.

    With an object store, a redirect to a presigned URL of it; 404 when the renderer made none, 410 once retention
    deleted the stage's files.
    """
    return _serve(gw, pipeline_id, events.Stage.VIDEO, who.tenant_filter(), poster=True)


FormatSlug = Annotated[str, Path(pattern=api.FORMAT_SLUG_PATTERN, description="9x16, 1x1 or 16x9")]


@router.get(
    "/pipelines/{pipeline_id}/artifacts/video/formats/{form}",
    response_class=FileResponse,
    responses={307: {"description": "a presigned URL of the object store"}, 404: {"model": api.Problem}, **DELETED},
)
def download_format(pipeline_id: uuid.UUID, form: FormatSlug, gw: GatewayDep, who: Reader) -> Response:
    """The video in one of the formats its brief asked for (9x16 is 9:16).

    With an object store, a redirect to a presigned URL of it; 404 for a format the brief did not ask for, 410 once
    retention deleted the stage's files.
    """
    return _serve(gw, pipeline_id, events.Stage.VIDEO, who.tenant_filter(), shape=api.FORMAT_OF_SLUG[form])


@router.get(
    "/pipelines/{pipeline_id}/artifacts/video/formats/{form}/poster",
    response_class=FileResponse,
    responses={307: {"description": "a presigned URL of the object store"}, 404: {"model": api.Problem}, **DELETED},
)
def download_format_poster(pipeline_id: uuid.UUID, form: FormatSlug, gw: GatewayDep, who: Reader) -> Response:
    """The poster of the video in one of its formats: a still (JPEG) of that format's frame.

    With an object store, a redirect to a presigned URL of it; 404 for a format the brief did not ask for or one
    made without a poster, 410 once retention deleted the stage's files.
    """
    shape = api.FORMAT_OF_SLUG[form]
    return _serve(gw, pipeline_id, events.Stage.VIDEO, who.tenant_filter(), shape=shape, poster=True)


@router.get(
    "/pipelines/{pipeline_id}/artifacts/video/photos/{photo}",
    response_class=FileResponse,
    responses={307: {"description": "a presigned URL of the object store"}, 404: {"model": api.Problem}, **DELETED},
)
def download_fetched_photo(
    pipeline_id: uuid.UUID,
    photo: Annotated[int, Path(ge=0, lt=brief.MAX_PHOTOS, description="its place in the brief's photos")],
    gw: GatewayDep,
    who: Reader,
) -> Response:
    """A photo the brief names by URL as the video stage fetched and kept it.

    With an object store, a redirect to a presigned URL of it; 404 for a photo the stage did not fetch (an
    upload: GET /v1/images/{id}/content), 410 once retention deleted the stage's files.
    """
    return _serve(gw, pipeline_id, events.Stage.VIDEO, who.tenant_filter(), photo)


@router.get(
    "/pipelines/{pipeline_id}/artifacts/song/captions.{form}",
    response_class=Response,
    responses={
        200: {"content": {media_type: {} for media_type in api.CAPTION_MEDIA_TYPES.values()}, "description": "a file"},
        404: {"model": api.Problem},
        **DELETED,
    },
)
def download_captions(pipeline_id: uuid.UUID, form: api.CaptionFormat, gw: GatewayDep, who: Reader) -> Response:
    """The song's sung lines as a caption file, timed as the song stage sang them: SubRip (srt) or WebVTT (vtt).

    WebVTT times each syllable within its line (karaoke). 404 before the song is made (or for a song recorded by a
    gateway of a release that kept no lines), 410 once retention deleted the song.
    """
    made, now = _made(gw, pipeline_id, events.Stage.SONG, who.tenant_filter())
    with gw.engine.connect() as conn:
        lines = repository.sung_lines(conn, pipeline_id) if made.captioned else None
    if lines is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, "the song has no sung lines kept (made by an earlier release)")
    _not_deleted(gw, made, now, "the song")
    return Response(
        captions.render(lines, form),
        media_type=f"{api.CAPTION_MEDIA_TYPES[form]}; charset=utf-8",
        headers={
            "Content-Disposition": artifacts.attachment(f"{pipeline_id}-song.{form.value}"),
            "X-Content-Type-Options": "nosniff",
        },
    )


def _made(
    gw: Gateway, pipeline_id: uuid.UUID, stage: events.Stage, tenant: str | None
) -> tuple[records.Stage, dt.datetime]:
    """The stage of the tenant's pipeline once it made its artifact, and the database's time now.

    404: no such pipeline, or nothing made yet.
    """
    with gw.engine.connect() as conn:
        if repository.get_pipeline(conn, pipeline_id, tenant) is None:
            raise errors.NotFound(f"no pipeline {pipeline_id}")
        made, now = repository.get_stage(conn, pipeline_id, stage), repository.now(conn)
    if made is None or made.artifact is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{stage.value} has no artifact yet")
    return made, now


def formats_of(made: records.Stage) -> list[dict[str, Any]]:
    """The formats of the stage's artifact: none recorded with an earlier one.

    A gateway of the release before records a video made again (an operator's retry) without its formats, leaving
    those of the video before in place."""
    formats = made.formats or []
    if not formats or made.artifact is None or formats[0]["artifact"]["sha256"] != made.artifact["sha256"]:
        return []
    return formats


def _not_deleted(gw: Gateway, made: records.Stage, now: dt.datetime, file: str) -> None:
    """410 once retention deleted the stage's files (CASTAD_RETENTION_ARTIFACTS_S after it ended)."""
    if made.finished_at is not None and gw.config.retention_policy().artifacts_gone(made.finished_at, now):
        raise HTTPException(status.HTTP_410_GONE, f"{file} was deleted by retention (CASTAD_RETENTION_ARTIFACTS_S)")


def _serve(
    gw: Gateway,
    pipeline_id: uuid.UUID,
    stage: events.Stage,
    tenant: str | None,
    photo: int | None = None,
    poster: bool = False,
    shape: brief.Format | None = None,
) -> Response:
    """A file of the stage of the pipeline: its artifact or `poster` (a format's: `shape`), or a `photo` it fetched.

    Only a file in that stage's place of that pipeline is served, whatever its event named.
    """
    made, now = _made(gw, pipeline_id, stage, tenant)
    if shape is not None:
        told = {render["format"]: render for render in formats_of(made)}.get(shape.value)
        if told is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"the {stage.value} stage made no {shape} video")
        render = events.Render.model_validate(told)
        what = "poster" if poster else "video"
        chosen = render.poster if poster else render.artifact
        if chosen is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"the {stage.value} stage made no {shape} poster")
        artifact, name = chosen, f"{pipeline_id}-{shape.slug}" + ("-poster" if poster else "")
        file = kept = f"the {stage.value} stage's {shape} {what}"
    elif poster:
        if made.poster is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"the {stage.value} stage made no poster")
        artifact, name = events.Artifact.model_validate(made.poster), f"{pipeline_id}-poster"
        file = kept = f"the {stage.value} stage's poster"
    elif photo is None:
        artifact, name = events.Artifact.model_validate(made.artifact), f"{pipeline_id}-{stage.value}"
        file, kept = f"the {stage.value} file", f"{stage.value} artifact"
    else:
        told = {fetched["photo"]: fetched for fetched in made.fetched_photos or ()}.get(photo)
        if told is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"the {stage.value} stage fetched no photos[{photo}]")
        artifact, name = events.FetchedPhoto.model_validate(told).file, f"{pipeline_id}-photo-{photo}"
        file = kept = f"the {stage.value} stage's photos[{photo}]"
    _not_deleted(gw, made, now, file)
    try:
        where = gw.store.serve(artifact, str(pipeline_id), stage)
    except artifacts.ArtifactMisplaced as error:  # its event named another pipeline's or stage's file
        log.warning("not served: %s", error)
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{kept} is not in this store") from None
    except artifacts.ArtifactMissing:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{kept} is not in this store") from None
    return gw.file(where, served.Recorded(artifact.sha256, artifact.size), artifact.media_type, name)
