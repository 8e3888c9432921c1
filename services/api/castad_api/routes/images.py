"""Images a tenant uploads for its briefs to name as photos.

Upload one, read what was kept of it, fetch it (with a key of its tenant, or by a link the video stage signed for
its render API: castad_runtime.links).

An upload is the image's bytes as the body (Content-Type image/jpeg, image/png or image/webp) or a
multipart form with the image as its `file` field. It is kept only once it decoded whole and was
made safe (castad_runtime.images): nothing of a refused upload is stored. A tenant uploads at a rate and holds images
up to limits of its own (upload_limits.py): past its rate it gets 429 with Retry-After before its body is
read, past what it may hold a 409. The image is recorded, then kept in the artifact store outside any
transaction, then recorded kept (`keep`): a slow store holds no row lock. Its record's last upload, moved to now
first, keeps retention from choosing it meanwhile (retention.py); a failure after the file is kept leaves a file
no found record names, which the same upload made again finds in its place (names are the bytes' own).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import time
import uuid

from castad_contracts import api
from castad_runtime import artifacts, db, images
from fastapi import APIRouter, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response

from castad_api import decoding, deps, errors, records, repository, served, upload_limits, uploaded
from castad_api.deps import GatewayDep, Reader, Submitter
from castad_api.routes import common

log = logging.getLogger(__name__)
UPLOAD_PATH = "/v1/images"
MULTIPART_OVERHEAD_BYTES = 16_384  # a form's boundaries and part headers, beyond the image's own bytes
FILE_FIELD = "file"
DELETION_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # an upload waits this for retention's deletion of its image
router = APIRouter(prefix="/v1", tags=["images"], responses={**deps.AUTH_ERRORS})
_ACCEPTED = ", ".join(images.MEDIA_TYPES)
_BODY = {
    "required": True,
    "content": {
        **{media_type: {"schema": {"type": "string", "format": "binary"}} for media_type in images.MEDIA_TYPES},
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {FILE_FIELD: {"type": "string", "format": "binary"}},
                "required": [FILE_FIELD],
            }
        },
    },
}


@router.post(
    "/images",
    status_code=status.HTTP_201_CREATED,
    response_model=api.Image,
    dependencies=[deps.SUBMIT_ONLY],
    openapi_extra={"requestBody": _BODY},
    responses={
        400: {"model": api.Problem, "description": "a multipart body that does not parse"},
        409: {
            "model": api.Problem,
            "description": "the tenant holds as many images, or bytes of them, as it may"
            " (CASTAD_API_IMAGE_MAX_PER_TENANT, CASTAD_API_IMAGE_MAX_BYTES_PER_TENANT)",
        },
        413: {"model": api.Problem, "description": "larger than CASTAD_API_IMAGE_MAX_BYTES"},
        415: {"model": api.Problem},
        422: {"description": "not an image kept here, and why: the field and the reason"},
        429: {
            "model": api.Problem,
            "description": "the tenant uploaded as fast as it may (CASTAD_API_IMAGE_UPLOADS_PER_MINUTE after"
            " CASTAD_API_IMAGE_UPLOAD_BURST), or its client address failed authentication too often (see Retry-After)",
        },
        503: {
            "model": api.Problem,
            "description": "as many uploads as may wait for their decode are waiting, the store is out, or an image of"
            " these bytes is being deleted by retention (see Retry-After)",
        },
    },
)
async def upload_image(request: Request, gw: GatewayDep, who: Submitter) -> api.Image:
    """Upload a JPEG, PNG or WebP image for briefs of the key's tenant to name in `photos`.

    It is decoded whole (refused past CASTAD_API_IMAGE_MAX_PIXELS pixels or CASTAD_API_IMAGE_MAX_BYTES bytes),
    turned as its EXIF orientation says and encoded again without any of its metadata (location, camera, comments,
    colour profile); its id, and the size and sha256 of what was kept, are answered. The same image uploaded again
    by the tenant is the same image, kept CASTAD_API_RETENTION_IMAGES_S from then on unless a pipeline or a brand
    kit names it. A
    tenant uploads at most CASTAD_API_IMAGE_UPLOAD_BURST images at once, then CASTAD_API_IMAGE_UPLOADS_PER_MINUTE a
    minute (429 with Retry-After), and holds at most CASTAD_API_IMAGE_MAX_PER_TENANT images of
    CASTAD_API_IMAGE_MAX_BYTES_PER_TENANT bytes in all (409). A gateway process decodes one upload at a time; past
    a few waiting, the next is refused with 503 and Retry-After.
    """
    try:
        with gw.decoding.admitted():  # taken before the body is read: a refused upload's body never is
            await run_in_threadpool(_counted, gw, who.tenant)
            cleaned = await _cleaned(request, gw)
    except decoding.Busy:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "as many image uploads as this gateway takes at once are in progress; try again shortly",
            {"Retry-After": str(decoding.RETRY_AFTER_S)},
        ) from None
    return await run_in_threadpool(keep, gw, who.tenant, cleaned)


async def _cleaned(request: Request, gw: deps.Gateway) -> images.Cleaned:
    loc, data, declared = await _received(request)
    clean = functools.partial(
        images.clean,
        data,
        max_bytes=gw.config.image_max_bytes,
        max_pixels=gw.config.image_max_pixels,
        declared=declared,
    )
    try:
        return await gw.decoding.run(clean)
    except images.ImageRefused as refused:
        raise errors.invalid(loc, f"the image {refused}") from None


async def _received(request: Request) -> tuple[tuple[str, ...], bytes, str | None]:
    """Where the image is in the request, its bytes, and the media type it was sent as (None: not said)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in images.MEDIA_TYPES:
        return ("body",), await request.body(), content_type
    if content_type != "multipart/form-data":
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be {_ACCEPTED} or multipart/form-data"
        )
    form = await request.form(max_files=1, max_fields=0)
    try:
        part = form.get(FILE_FIELD)
        if part is None or isinstance(part, str):  # none, or a text field: not a file
            raise errors.invalid(("body", FILE_FIELD), f"a file field named {FILE_FIELD!r} is needed")
        said = (part.content_type or "").lower()
        return ("body", FILE_FIELD), await part.read(), said if said in images.MEDIA_TYPES else None
    finally:
        await form.close()


def _counted(gw: deps.Gateway, tenant: str) -> None:
    """Count an upload of the tenant's; a 429 with Retry-After if it uploaded as fast as it may."""
    try:
        with db.transaction(gw.engine) as conn:
            upload_limits.take(conn, tenant, gw.config.upload_limits())  # rolled back when over
    except upload_limits.OverRate as over:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"this tenant may upload {gw.config.image_upload_burst} images at once, then"
            f" {gw.config.image_uploads_per_minute:g} a minute",
            {"Retry-After": str(math.ceil(over.wait_s))},
        ) from None


def keep(gw: deps.Gateway, tenant: str, cleaned: images.Cleaned) -> api.Image:
    """Keep a cleaned upload for the tenant, if it has room for it (errors.Full if not), and describe it.

    Recorded first (`uploaded.begin_image`), its file then kept outside any transaction, then recorded kept. An
    image of the same bytes that retention is deleting is waited for a few seconds (its row goes once its file is
    gone), then the upload is refused with 503 and Retry-After. An upload whose file was not kept (the store refused
    it, say) takes its record back.
    """
    digest = hashlib.sha256(cleaned.data).hexdigest()
    size = len(cleaned.data)
    for pause_s in (*DELETION_PAUSES_S, None):
        with db.transaction(gw.engine) as conn:
            upload_limits.check_room(conn, tenant, digest, size, gw.config.upload_limits())
            begun = uploaded.begin_image(conn, tenant, digest, cleaned.media_type, size, cleaned.width, cleaned.height)
        if begun is not None:
            try:
                kept = gw.store.keep_image(cleaned.data, tenant, cleaned.media_type)
            except BaseException:
                _forget_begun(gw, begun.id)
                raise
            with db.transaction(gw.engine) as conn:
                row = uploaded.image_kept(conn, begun.id, kept)
            if row is not None:
                return _image(row)
        if pause_s is not None:  # retention is deleting the image of these bytes, or deleted it meanwhile
            time.sleep(pause_s)
    raise HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE,
        "an image of these bytes is being deleted by retention; try again shortly",
        {"Retry-After": "1"},
    )


def _forget_begun(gw: deps.Gateway, image_id: uuid.UUID) -> None:
    """Delete the record of an upload whose file was not kept; if the database is out too, retention will."""
    try:
        with db.transaction(gw.engine) as conn:
            uploaded.forget_image_begun(conn, image_id)
    except Exception:
        log.warning("the record of upload %s, whose file was not kept, is left to retention", image_id, exc_info=True)


@router.get("/images/{image_id}", response_model=api.Image, responses={404: {"model": api.Problem}})
def get_image(image_id: uuid.UUID, gw: GatewayDep, who: Reader) -> api.Image:
    """What was kept of an image the key's tenant uploaded."""
    with gw.engine.connect() as conn:
        row = uploaded.get_image(conn, image_id, who.tenant_filter())
    if row is None:
        raise errors.NotFound(f"no image {image_id}")
    return _image(row)


@router.get(
    "/images/{image_id}/content",
    response_class=FileResponse,
    responses={
        200: {"content": {media_type: {} for media_type in images.MEDIA_TYPES}, "description": "the kept image"},
        307: {"description": "a presigned URL of the object store"},
        404: {"model": api.Problem},
    },
)
def image_content(image_id: uuid.UUID, gw: GatewayDep, who: Reader) -> Response:
    """The image as it was kept, or (with an object store) a redirect to a presigned URL of it.

    It was kept upright, without metadata.
    """
    with gw.engine.connect() as conn:
        row = uploaded.get_image(conn, image_id, who.tenant_filter())
    if row is None:
        raise errors.NotFound(f"no image {image_id}")
    return _content(gw, row)


@router.get(
    "/links/pipelines/{pipeline_id}/photos/{image_id}",
    response_class=FileResponse,
    tags=["providers"],
    responses=common.LINK_ERRORS,
    dependencies=common.SIGNED_LINK,
)
def linked_photo(pipeline_id: uuid.UUID, image_id: uuid.UUID, gw: GatewayDep) -> Response:
    """A photo of a pipeline's brief, or its brand's logo, by a link the video stage signed for its render API.

    The image only if that pipeline's brief names it and it is the pipeline's tenant's.
    """
    with gw.engine.connect() as conn:
        pipeline = repository.get_pipeline(conn, pipeline_id)
        logo = ((pipeline.brief.get("brand") or {}).get("logo") or {}) if pipeline is not None else {}
        shown = [*pipeline.brief.get("photos", ()), logo] if pipeline is not None else []
        named = any(p.get("id") == str(image_id) for p in shown)
        row = uploaded.get_image(conn, image_id, pipeline.tenant) if pipeline is not None and named else None
    if row is None:
        raise errors.NotFound(f"no image {image_id} in the brief of pipeline {pipeline_id}")
    return _content(gw, row)


def _content(gw: deps.Gateway, row: records.Image) -> Response:
    """The kept file of an image, or a redirect to a presigned URL of it."""
    try:
        where = gw.store.serve_image(uploaded.photo(row))
    except artifacts.ArtifactMissing:
        raise errors.NotFound(f"image {row.id} is not in this store") from None
    return gw.file(where, served.Recorded(row.sha256, row.size), row.media_type, str(row.id))


def _image(row: records.Image) -> api.Image:
    return api.Image(
        id=str(row.id),
        sha256=row.sha256,
        media_type=row.media_type,
        size=row.size,
        width=row.width,
        height=row.height,
        created_at=row.created_at,
    )
