"""A pipeline's timeline, and the stream of every pipeline's timeline entries for live boards."""

from __future__ import annotations

import functools
import time
import uuid
from typing import Annotated

import sqlalchemy as sa
from castad_contracts import api, events
from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from sse_starlette.sse import EventSourceResponse

from castad_api import deps, disclosure, errors, model, notifications, repository, streams, timeline, timeline_rows
from castad_api.deps import GatewayDep, Reader
from castad_api.routes import common

router = APIRouter(prefix="/v1", tags=["pipelines"], responses={**deps.AUTH_ERRORS, **deps.UNREADABLE})
SCAN = 500  # timeline entries the stream of every pipeline looks at per read, whatever its filters keep
GAP_WAIT_S = 5.0  # how long that stream waits for a missing entry (see timeline.settle) before it goes on


@router.get(
    "/pipelines/{pipeline_id}/timeline",
    response_model=api.PipelineTimeline,
    responses={404: {"model": api.Problem}},
)
def pipeline_timeline(
    pipeline_id: uuid.UUID,
    gw: GatewayDep,
    who: Reader,
    after: Annotated[
        int, Query(ge=0, le=2**63 - 1, description="only the entries after the one of this seq (its number)")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="at most this many entries")] = 1000,
) -> api.PipelineTimeline:
    """Everything that happened to the pipeline, in order and at the time it happened.

    Each stage's events, the operators' actions (cancel, retry, dead-letter replays and discards), dead letters
    about it. With every attempt (its worker, duration, outcome, error), the actions on their own, and the
    pipeline's trace id and its link to a trace viewer (CASTAD_API_TRACE_URL). Entries are numbered among the
    pipeline's own (`seq`). To a tenant's key: a worker as an opaque id, an error as its code and public message, a
    dead letter without its reason, no trace link (disclosure.py).
    """
    with gw.engine.connect() as conn:
        pipeline = repository.get_pipeline(conn, pipeline_id, who.tenant_filter())
        if pipeline is None:
            raise errors.NotFound(f"no pipeline {pipeline_id}")
        rows = timeline_rows.timeline_after(conn, pipeline_id, after, limit + 1)
        attempts = repository.pipeline_attempts(conn, pipeline_id)
    links = common.links(str(pipeline_id))
    more = len(rows) > limit
    return timeline.build(pipeline, rows[:limit], attempts, more, gw.config.trace_url, links, gw.viewer(who))


@router.get(
    "/events",
    response_class=EventSourceResponse,
    tags=["events"],
    responses={200: {"content": {"text/event-stream": {}}, "description": "the event stream"}, **streams.TOO_MANY},
)
async def every_pipeline_events(
    gw: GatewayDep,
    who: Reader,
    status_: Annotated[
        model.PipelineStatus | None, Query(alias="status", description="only entries after which the pipeline is so")
    ] = None,
    stage: Annotated[events.Stage | None, Query(description="only entries of this stage")] = None,
    last_event_id: streams.LastEventId = None,
) -> EventSourceResponse:
    """Server-Sent Events: the timeline entries of every pipeline as they are written.

    A key's tenant's pipelines; an admin's: everyone's. Each entry is as on a pipeline's timeline plus its
    pipeline's id, tenant, customer name and region (event `entry`, data api.FirehoseEntry). Starts after the
    newest entry, or after Last-Event-ID (each event's id is a cursor of this stream: to an admin key the entry's
    place among all of the gateway's, to a tenant's an opaque one), at most CASTAD_API_SSE_RESUME_MAX_ENTRIES
    entries (of every tenant) back. Keep-alive comments; closed after CASTAD_API_FIREHOSE_MAX_S, when a client
    reconnects with Last-Event-ID and loses nothing, or within seconds of its key's revocation. A key holds at most
    CASTAD_API_SSE_STREAMS_PER_KEY streams at once.
    """
    viewer = gw.viewer(who)
    resumed = await run_in_threadpool(viewer.resumes_after, last_event_id)  # a tenant's: with the keyring
    newest = await run_in_threadpool(_newest, gw.engine)
    after = newest if resumed is None else max(resumed, newest - gw.config.sse_resume_max_entries)
    read = functools.partial(entries_after, gw.engine, viewer, status_, stage)
    lease = streams.admit(gw, who)
    return EventSourceResponse(
        streams.follow(
            gw, lease, notifications.EVERY_PIPELINE, read, timeline.Position(after), gw.config.firehose_max_s
        ),
        ping=gw.config.sse_ping_s,
    )


def _newest(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return timeline_rows.newest_entry(conn)


def entries_after(
    engine: sa.Engine,
    viewer: disclosure.Viewer,
    status: model.PipelineStatus | None,
    stage: events.Stage | None,
    position: timeline.Position,
) -> streams.Batch[timeline.Position]:
    """The stream's next read.

    The viewer's tenant's entries (an admin's: everyone's) matching the filters, from `position` up to the first
    gap in the entries' seqs still waited for.
    """
    with engine.connect() as conn:
        rows = timeline_rows.entries_of_all(conn, position.after, SCAN, viewer.tenant, status, stage)
    settled = timeline.settle(position, [row.seq for row in rows], time.monotonic(), GAP_WAIT_S)
    messages = [
        {"id": viewer.cursor(row.seq), "event": "entry", "data": timeline.firehose_entry(row, viewer).model_dump_json()}
        for row in rows
        if row.shown and row.seq <= settled.after
    ]
    more = len(rows) == SCAN and settled.after == rows[-1].seq
    # Stopped at a missing entry: if it never commits, no notification tells, so the stream looks again then.
    again_s = None if settled.waiting_since is None else GAP_WAIT_S
    return streams.Batch(messages, settled, more=more, again_s=again_s)
