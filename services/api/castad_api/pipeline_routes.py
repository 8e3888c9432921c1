"""The pipelines: create one, read it, follow it, get its files, cancel it, retry it."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import functools
import json
import logging
import uuid
from collections.abc import Callable
from typing import Annotated, Any

import sqlalchemy as sa
from castad_contracts import api, brief, events
from castad_runtime import artifacts, db
from castad_runtime import links as signed_links
from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response
from sse_starlette.sse import EventSourceResponse

from castad_api import (
    buckets,
    captions,
    deps,
    disclosure,
    errors,
    keys,
    model,
    operations,
    records,
    repository,
    reviews,
    served,
    streams,
    timeline,
    usage,
    webhooks,
)
from castad_api.deps import Actor, Gateway, GatewayDep, Operator, Reader, Submitter

log = logging.getLogger(__name__)
IdempotencyKey = Annotated[
    str,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        pattern=r"^[\x21-\x7e]+$",
        description="client-chosen key; the same key and body always give the same pipeline",
    ),
]
router = APIRouter(prefix="/v1", tags=["pipelines"], responses={**deps.AUTH_ERRORS, **deps.UNREADABLE})


# A creation past its tenant's budget (usage.py): the message names the limit and when it resets.
OVER_BUDGET: dict[int | str, dict[str, Any]] = {
    402: {
        "model": api.Problem,
        "description": "the tenant's budget of seconds of song or of estimated cost for the day or month is reached"
        " (see Retry-After: when it resets)",
    }
}


class _OverLimit(Exception):
    """The key made too many pipelines this minute: the next may come in `wait_s`."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(wait_s)
        self.wait_s = wait_s


def _too_many(gw: Gateway, wait_s: float) -> HTTPException:
    return HTTPException(
        status.HTTP_429_TOO_MANY_REQUESTS,
        f"this key may create {gw.config.creations_per_minute} pipelines a minute",
        {"Retry-After": buckets.retry_after(wait_s)},
    )


async def require_json(request: Request) -> None:  # async: no thread of FastAPI's pool for a header's check
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json")


def links(pipeline_id: str) -> api.Links:
    base = f"/v1/pipelines/{pipeline_id}"
    return api.Links(self=base, events=f"{base}/events", cancel=f"{base}/cancel", retry=f"{base}/retry")


@router.post(
    "/pipelines",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.PipelineAccepted,
    dependencies=[deps.SUBMIT_ONLY, Depends(require_json)],
    responses={
        409: {"model": api.Problem, "description": "the Idempotency-Key was used with another body"},
        413: {"model": api.Problem},
        415: {"model": api.Problem},
        402: OVER_BUDGET[402],
        429: {
            "model": api.Problem,
            "description": "the key made too many pipelines this minute, its tenant's budget of pipelines is reached,"
            " or its client address failed authentication too often (see Retry-After)",
        },
    },
)
def create_pipeline(
    body: api.PipelineRequest, key: IdempotencyKey, gw: GatewayDep, who: Submitter
) -> api.PipelineAccepted:
    """Accept a brief; publishes pipeline.requested.

    Replays of the same key and body are answered alike (an Idempotency-Key is the tenant's own: another tenant's
    same key makes another pipeline).
    """
    operations.check_photo_urls(body, gw.config.photo_allow_private)
    return _accepted(
        gw,
        who,
        body.callback_url,
        lambda conn: operations.create(
            conn, body, who.tenant, key, gw.config.pipeline_deadline_s, gw.config.link_secret
        ),
    )


def _accepted(
    gw: Gateway,
    who: keys.Principal,
    callback_url: str | None,
    make: Callable[[sa.Connection], operations.Accepted],
) -> api.PipelineAccepted:
    """A pipeline `make` creates in a transaction, as a creation of the key (a new brief, a remake).

    Refused first for a callback URL no notice may go to, or a key that made too many pipelines this minute; then,
    made, if it takes its tenant past a budget.
    """
    refused = callback_url and webhooks.refusal(callback_url, gw.config)
    if callback_url and not refused:
        with gw.engine.connect() as conn:
            refused = webhooks.tenant_refusal(conn, who.tenant, gw.config)
    if refused:
        raise errors.invalid(("body", "callback_url"), refused, callback_url)
    if who.minute.created >= gw.config.creations_per_minute:  # used up when the key was read: no work at all
        raise _too_many(gw, who.minute.retry_after_s())
    try:
        with db.transaction(gw.engine) as conn:
            accepted = make(conn)
            if accepted.created:  # counted in the tenant's usage, within its budgets (or rolled back: OverBudget)
                usage.admit(conn, who.tenant, gw.config.prices)
                db.after_commit(conn, lambda: gw.metrics.used(who.tenant, {api.Meter.PIPELINES: 1}))
            # Counted last: every creation of the key waits for the lock of its counter, held until the commit.
            # This count decides: creations of other requests or replicas may have come since the key was read.
            wait_s = keys.count_creation(conn, who.key_id, gw.config.creations_per_minute)
            if wait_s is not None:
                raise _OverLimit(wait_s)  # the creation is rolled back
    except _OverLimit as over:
        raise _too_many(gw, over.wait_s) from None
    if accepted.created:
        gw.metrics.pipelines_created.inc()
    pipeline_id = str(accepted.pipeline_id)
    return api.PipelineAccepted(
        id=pipeline_id, status=accepted.status.value, created=accepted.created, links=links(pipeline_id)
    )


@router.post(
    "/pipelines/{pipeline_id}/remake",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.PipelineAccepted,
    dependencies=[deps.SUBMIT_ONLY, Depends(require_json)],
    responses={
        404: {"model": api.Problem},
        409: {
            "model": api.Conflict,
            "description": "the pipeline has not ended with the stages before the one made again succeeded, retention"
            " deletes their files before the remake could copy them, or the Idempotency-Key was used with another"
            " body",
        },
        413: {"model": api.Problem},
        415: {"model": api.Problem},
        402: OVER_BUDGET[402],
        429: {
            "model": api.Problem,
            "description": "the key made too many pipelines this minute, or its tenant's budget of pipelines is reached"
            " (see Retry-After)",
        },
    },
)
def remake_pipeline(
    pipeline_id: uuid.UUID, body: api.RemakeRequest, key: IdempotencyKey, gw: GatewayDep, who: Submitter
) -> api.PipelineAccepted:
    """Make an ended pipeline again from `from` on, with `changes`: a new pipeline, linked both ways.

    The stages before `from` copy their files of it (no provider is asked again, nothing is paid for again): from
    `video`, a new video of the same song (orientation, formats, photos, brand); from `song`, a new song of the same
    lyrics (its genre too) and its video. It counts as a creation of the key.
    """
    return _accepted(
        gw,
        who,
        body.callback_url,
        lambda conn: operations.remake(
            conn,
            pipeline_id,
            body,
            who.tenant,
            key,
            gw.config.pipeline_deadline_s,
            gw.config.retention_policy(),
            gw.config.link_secret,
            gw.config.photo_allow_private,
        ),
    )


@router.post(
    "/pipelines/{pipeline_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.ActionAccepted,
    responses={
        404: {"model": api.Problem},
        409: {"model": api.Conflict, "description": "the pipeline had already ended SUCCEEDED or FAILED"},
    },
)
def cancel_pipeline(
    pipeline_id: uuid.UUID,
    gw: GatewayDep,
    who: Operator,
    actor: Actor = "anonymous",
    body: api.CancelRequest | None = None,
) -> api.ActionAccepted:
    """Cancel a pipeline that has not ended.

    Every stage stops its job (a running attempt is stopped, a stage not reached yet never starts), a stage that
    completed keeps its artifact. Idempotent: asking again gives 202 and changes nothing. The status is CANCELING
    until every stage has answered, then CANCELED.
    """
    reason = (body or api.CancelRequest()).reason
    with db.transaction(gw.engine) as conn:
        done = operations.cancel(conn, pipeline_id, reason, actor, who.tenant_filter(), who.acting())
    return api.ActionAccepted(
        id=str(pipeline_id), status=done.status.value, operation=done.operation, links=links(str(pipeline_id))
    )


@router.post(
    "/pipelines/{pipeline_id}/retry",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.ActionAccepted,
    responses={
        404: {"model": api.Problem},
        409: {
            "model": api.Conflict,
            "description": "the pipeline is not FAILED or CANCELED, or it ended so long ago that retention deletes"
            " its stages' jobs or files before a retry could end",
        },
    },
)
def retry_pipeline(
    pipeline_id: uuid.UUID,
    gw: GatewayDep,
    who: Operator,
    actor: Actor = "anonymous",
    body: api.RetryRequest | None = None,
) -> api.ActionAccepted:
    """Resume a FAILED or CANCELED pipeline at its first stage that did not succeed.

    It gets a fresh attempt budget (`max_attempts` per stage, optional); stages that succeeded keep their artifacts
    and are not run again. The pipeline gets a fresh deadline. A pipeline can be retried until
    CASTAD_RETENTION_ARTIFACTS_S, less its deadline and an hour, after the first of its stages ended.
    """
    overrides = (body or api.RetryRequest()).max_attempts
    with db.transaction(gw.engine) as conn:
        done, resume = operations.retry(
            conn, pipeline_id, overrides, gw.config.retention_policy(), actor, who.tenant_filter(), who.acting()
        )
    return api.ActionAccepted(
        id=str(pipeline_id),
        status=done.status.value,
        operation=done.operation,
        resumes_at=resume,
        links=links(str(pipeline_id)),
    )


Expires = Annotated[int, Query(ge=0, le=2**40, description="when the link expires (Unix seconds)")]
Signature = Annotated[str, Query(pattern=r"^[0-9a-f]{64}$", description="the link's HMAC-SHA256")]


def _check_link(gw: GatewayDep, request: Request, expires: Expires, signature: Signature) -> None:
    """Check a link signed for a provider by the stage that signs links to this path.

    The link (castad_runtime.links) must be for this very path and its purpose, not expired and not valid for
    longer than CASTAD_API_LINK_MAX_S.
    """
    root = gw.config.link_secret
    if root is None or not signed_links.accepted(
        root, request.url.path, expires, signature, max_s=gw.config.link_max_s
    ):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "the link is not valid (altered, expired, too long-lived or not signed here)"
        )


SIGNED_LINK = [Depends(_check_link)]
LINK_ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": api.Problem}, 404: {"model": api.Problem}}


@router.post(
    "/provider-callbacks/{stage}/{pipeline_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    tags=["providers"],
    responses={
        **LINK_ERRORS,
        429: {"model": api.Problem, "description": "more callbacks of the stage of the pipeline than it takes"},
    },
    dependencies=SIGNED_LINK,
)
def provider_callback(stage: events.Stage, pipeline_id: uuid.UUID, gw: GatewayDep) -> Response:
    """Where a stage's network provider (a music or render API) calls back when its work moves on.

    The stage polls the provider at once instead of at its next scheduled poll. A link the stage signed (no API
    key: providers cannot send one). The body is not read; the poll alone decides what became of the work. A link
    stays valid while the work may take, so one sent again and again is taken at most
    CASTAD_API_CALLBACK_BURST times at once and CASTAD_API_CALLBACKS_PER_S after, per pipeline and stage (429 with
    Retry-After beyond: the stage's scheduled polls go on regardless).
    """
    wait_s = gw.callbacks.take((pipeline_id, stage))
    if wait_s is not None:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"more callbacks of the {stage.value} stage of this pipeline than it takes: try again later",
            {"Retry-After": buckets.retry_after(wait_s)},
        )
    with db.transaction(gw.engine) as conn:
        operations.called_back(conn, pipeline_id, stage)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _view(
    row: records.Pipeline,
    stage_rows: list[records.Stage],
    viewer: disclosure.Viewer = disclosure.INTERNAL,
    draft: reviews.Draft | None = None,
    remakes: list[uuid.UUID] | None = None,
) -> api.PipelineView:
    pid = str(row.id)
    reused = events.STAGE_ORDER[: events.STAGE_ORDER.index(events.Stage(row.remade_from))] if row.remade_from else ()
    by_stage = {stage_row.stage: stage_row for stage_row in stage_rows}
    stages = []
    for stage in events.STAGE_ORDER:
        s = by_stage.get(stage.value)
        artifact, fetched, captions_, poster, formats = None, [], [], None, []
        if s is not None and s.artifact:
            artifact = api.ArtifactLink.of(pid, stage, s.artifact)
            poster = api.ArtifactLink.of(pid, stage, s.poster, "poster") if s.poster else None
            fetched = [api.FetchedPhotoLink.of(pid, photo) for photo in s.fetched_photos or ()]
            captions_ = [api.CaptionLink.of(pid, form) for form in api.CaptionFormat] if s.captioned else []
            formats = [api.FormatLink.of(pid, render) for render in _formats(s)]
        stages.append(
            api.StageView(
                stage=stage,
                status=s.status if s else model.StageStatus.PENDING.value,
                attempts=s.attempt if s else 0,
                max_attempts=s.max_attempts if s else None,
                last_error_code=s.last_error_code if s else None,
                last_error_message=viewer.error_message(s.last_error_code, s.last_error_message) if s else None,
                next_attempt_at=s.next_attempt_at if s else None,
                started_at=s.started_at if s else None,
                finished_at=s.finished_at if s else None,
                artifact=artifact,
                fetched_photos=fetched,
                poster=poster,
                captions=captions_,
                formats=formats,
                reused_from=str(row.remake_of) if stage in reused else None,
            )
        )
    return api.PipelineView(
        id=pid,
        status=row.status,
        progress=row.progress,
        current_stage=row.current_stage,
        error_code=row.error_code,
        error_message=viewer.error_message(row.error_code, row.error_message),
        brief=row.brief,
        created_at=row.created_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
        cancel_requested_at=row.cancel_requested_at,
        cancel_reason=row.cancel_reason,
        retries=row.retries,
        deadline_at=None if row.deadline_paused_at else row.deadline_at,
        review=reviews.view(row, draft),
        remake_of=None
        if row.remake_of is None
        else api.RemakeLink(id=str(row.remake_of), from_=row.remade_from, links=links(str(row.remake_of))),
        remakes=[str(remake) for remake in remakes or ()],
        stages=stages,
        links=links(pid),
    )


def _load(gw: Gateway, pipeline_id: uuid.UUID, who: keys.Principal) -> api.PipelineView:
    """The pipeline as the API shows it to `who`; NotFound unless it is its tenant's (an admin's: anyone's)."""
    with gw.engine.connect() as conn:
        row = repository.get_pipeline(conn, pipeline_id, who.tenant_filter())
        if row is None:
            raise errors.NotFound(f"no pipeline {pipeline_id}")
        stage_rows = repository.get_stages(conn, [pipeline_id])[pipeline_id]
        drafts = reviews.current(conn, [pipeline_id]) if row.review else {}
        remade = repository.remakes(conn, [pipeline_id])[pipeline_id]
        return _view(row, stage_rows, gw.viewer(who), drafts.get(pipeline_id), remade)


@router.get("/pipelines/{pipeline_id}", response_model=api.PipelineView, responses={404: {"model": api.Problem}})
def get_pipeline(pipeline_id: uuid.UUID, gw: GatewayDep, who: Reader) -> api.PipelineView:
    """The pipeline's overall status and, per stage, its status, attempts, errors, times and artifact.

    The error shown is the last one; to a tenant's key, an error is its code and the code's public message.
    """
    return _load(gw, pipeline_id, who)


def _encode_cursor(row: records.Pipeline) -> str:
    return base64.urlsafe_b64encode(f"{row.created_at.isoformat()}|{row.id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    try:
        created, pid = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return dt.datetime.fromisoformat(created), uuid.UUID(pid)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise errors.invalid(("query", "cursor"), "not a cursor this API returned", cursor) from None


@router.get("/pipelines", response_model=api.PipelinePage)
def list_pipelines(
    gw: GatewayDep,
    who: Reader,
    status_: Annotated[model.PipelineStatus | None, Query(alias="status")] = None,
    stage: events.Stage | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    cursor: str | None = None,
    q: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=80,
            pattern=r"^[^\x00-\x1f\x7f]*$",
            description="a pipeline id, or a part of the customer's name (any case): anywhere in it from 3"
            " characters on, the beginning of one of its words for 1 or 2",
        ),
    ] = None,
) -> api.PipelinePage:
    """Newest first, filtered by overall status, by the stage a pipeline is at, and by a search."""
    limit = min(limit, gw.config.page_size_max)
    after = _decode_cursor(cursor) if cursor else None
    with gw.engine.connect() as conn:
        shown = repository.Listing(status_, stage, after, who.tenant_filter(), _search(q))
        rows = repository.list_pipelines(conn, shown, limit + 1)
        page = rows[:limit]
        stage_rows = repository.get_stages(conn, [row.id for row in page])
        drafts = reviews.current(conn, [row.id for row in page if row.review])
        remade = repository.remakes(conn, [row.id for row in page])
    next_cursor = _encode_cursor(page[-1]) if len(rows) > limit else None
    viewer = gw.viewer(who)
    items = [_view(row, stage_rows[row.id], viewer, drafts.get(row.id), remade[row.id]) for row in page]
    return api.PipelinePage(items=items, next_cursor=next_cursor)


def _search(q: str | None) -> str | uuid.UUID | None:
    """A pipeline id, or else the text to find in customers' names."""
    if q is None:
        return None
    try:
        return uuid.UUID(q.strip())
    except ValueError:
        return q


@router.get(
    "/pipelines/{pipeline_id}/events",
    response_class=EventSourceResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "the event stream"},
        404: {"model": api.Problem},
        **streams.TOO_MANY,
    },
)
async def pipeline_events(
    pipeline_id: uuid.UUID,
    gw: GatewayDep,
    who: Reader,
    last_event_id: streams.LastEventId = None,
) -> EventSourceResponse:
    """Server-Sent Events: step, status, progress, attempt.

    Artifacts on the final event. Resumable. Ends when the pipeline ended and every entry was sent, after
    CASTAD_API_STREAM_MAX_S (reconnect with Last-Event-ID), or within seconds of its key's revocation; a key holds
    at most CASTAD_API_SSE_STREAMS_PER_KEY streams at once.
    """
    after = streams.resumes_after(last_event_id) or 0
    await run_in_threadpool(_load, gw, pipeline_id, who)
    if after:
        after = await run_in_threadpool(_resumable, gw.engine, pipeline_id, after)
    read = functools.partial(_progress, gw.engine, pipeline_id, gw.viewer(who))
    lease = streams.admit(gw, who)
    following = streams.follow(gw, lease, str(pipeline_id), read, after, gw.config.stream_max_s)
    return EventSourceResponse(following, ping=gw.config.sse_ping_s)


def _resumable(engine: sa.Engine, pipeline_id: uuid.UUID, after: int) -> int:
    """Where a resumed stream starts.

    After the entry numbered `after`, or from the start for an id beyond the pipeline's entries, which its stream
    never sent (one from before entries were numbered per pipeline): the client sees entries again rather than
    none.
    """
    with engine.connect() as conn:
        return after if after <= repository.count_entries(conn, pipeline_id) else 0


def _progress(engine: sa.Engine, pipeline_id: uuid.UUID, viewer: disclosure.Viewer, after: int) -> streams.Batch[int]:
    """The pipeline's entries after the one numbered `after`, as `viewer` sees them.

    Each event's id is its entry's number; the stream ends once the pipeline ended and every entry was sent.
    """
    pid = str(pipeline_id)
    with engine.connect() as conn:
        row = repository.get_pipeline(conn, pipeline_id)
        terminal = row is not None and model.PipelineStatus(row.status).terminal
        rows = repository.timeline_after(conn, pipeline_id, after)
    messages = [
        {
            "id": str(row.number),
            "event": "progress",
            "data": json.dumps(viewer.entry(pid, timeline.public(pid, row.data)), ensure_ascii=False),
        }
        for row in rows
    ]
    return streams.Batch(messages, rows[-1].number if rows else after, more=bool(rows), ended=terminal and not rows)


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


def _formats(made: records.Stage) -> list[dict[str, Any]]:
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
        told = {render["format"]: render for render in _formats(made)}.get(shape.value)
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


@router.get(
    "/pipelines/{pipeline_id}/webhooks",
    response_model=list[api.WebhookDelivery],
    responses={404: {"model": api.Problem}},
)
def pipeline_webhooks(pipeline_id: uuid.UUID, gw: GatewayDep, who: Reader) -> list[api.WebhookDelivery]:
    """The notices sent to the brief's callback_url when the pipeline ended (once per ending), with every try."""
    _load(gw, pipeline_id, who)
    with gw.engine.connect() as conn:
        found = webhooks.deliveries(conn, pipeline_id)
    return [api.WebhookDelivery.model_validate({**dataclasses.asdict(d), "id": str(d.id)}) for d in found]
