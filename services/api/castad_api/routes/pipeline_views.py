"""A pipeline as read: one, a page of them newest first, and its event stream (Server-Sent Events).

What is asked of pipelines: routes/pipelines.py. Its own router, tagged as that one's, comes right after it, so
that the OpenAPI document lists the pipelines' paths as they always were."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import json
import uuid
from typing import Annotated

import sqlalchemy as sa
from castad_contracts import api, events
from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from sse_starlette.sse import EventSourceResponse

from castad_api import (
    deps,
    disclosure,
    errors,
    keys,
    listing,
    model,
    records,
    repository,
    reviews,
    streams,
    timeline,
    timeline_rows,
)
from castad_api.deps import Gateway, GatewayDep, Reader
from castad_api.routes import downloads
from castad_api.routes.common import links

router = APIRouter(prefix="/v1", tags=["pipelines"], responses={**deps.AUTH_ERRORS, **deps.UNREADABLE})


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
        shown = listing.Listing(status_, stage, after, who.tenant_filter(), _search(q))
        rows = listing.list_pipelines(conn, shown, limit + 1)
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
        return after if after <= timeline_rows.count_entries(conn, pipeline_id) else 0


def _progress(engine: sa.Engine, pipeline_id: uuid.UUID, viewer: disclosure.Viewer, after: int) -> streams.Batch[int]:
    """The pipeline's entries after the one numbered `after`, as `viewer` sees them.

    Each event's id is its entry's number; the stream ends once the pipeline ended and every entry was sent.
    """
    pid = str(pipeline_id)
    with engine.connect() as conn:
        row = repository.get_pipeline(conn, pipeline_id)
        terminal = row is not None and model.PipelineStatus(row.status).terminal
        rows = timeline_rows.timeline_after(conn, pipeline_id, after)
    messages = [
        {
            "id": str(row.number),
            "event": "progress",
            "data": json.dumps(viewer.entry(pid, timeline.public(pid, row.data)), ensure_ascii=False),
        }
        for row in rows
    ]
    return streams.Batch(messages, rows[-1].number if rows else after, more=bool(rows), ended=terminal and not rows)
