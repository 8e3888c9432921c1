"""The pipelines: create one, remake it, read it, list them, follow, cancel or retry it; providers' callbacks.

A pipeline's files: routes/downloads.py; the notices of its end: routes/webhooks.py."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import json
import logging
import uuid
from collections.abc import Callable
from typing import Annotated, Any

import sqlalchemy as sa
from castad_contracts import api, events
from castad_runtime import db
from fastapi import APIRouter, Depends, Header, HTTPException, Query, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from sse_starlette.sse import EventSourceResponse

from castad_api import (
    buckets,
    creation,
    deps,
    disclosure,
    errors,
    keys,
    model,
    operations,
    records,
    repository,
    reviews,
    streams,
    timeline,
    usage,
    webhooks,
)
from castad_api.deps import Actor, Gateway, GatewayDep, Operator, Reader, Submitter
from castad_api.routes import downloads
from castad_api.routes.common import LINK_ERRORS, SIGNED_LINK, links, require_json

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
    creation.check_photo_urls(body, gw.config.photo_allow_private)
    return _accepted(
        gw,
        who,
        body.callback_url,
        lambda conn: creation.create(conn, body, who.tenant, key, gw.config.pipeline_deadline_s, gw.config.link_secret),
    )


def _accepted(
    gw: Gateway,
    who: keys.Principal,
    callback_url: str | None,
    make: Callable[[sa.Connection], creation.Accepted],
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
        lambda conn: creation.remake(
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
            formats = [api.FormatLink.of(pid, render) for render in downloads.formats_of(s)]
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


def load(gw: Gateway, pipeline_id: uuid.UUID, who: keys.Principal) -> api.PipelineView:
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
    return load(gw, pipeline_id, who)


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
    await run_in_threadpool(load, gw, pipeline_id, who)
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
