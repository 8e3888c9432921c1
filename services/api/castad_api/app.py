"""The gateway's HTTP API."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import pika
import sqlalchemy as sa
from castad_contracts import api, brief, events
from castad_runtime import artifacts, db, outbox
from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from sse_starlette.sse import EventSourceResponse

from castad_api import model, notifications, projection, repository
from castad_api import settings as settings_

SOURCE = "/castad/api"
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


@dataclasses.dataclass
class Gateway:
    """What the routes need, built once by the composition root."""

    config: settings_.ApiSettings
    engine: sa.Engine
    notifications: notifications.PipelineNotifications
    store: artifacts.ArtifactStore


def gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


GatewayDep = Annotated[Gateway, Depends(gateway)]
router = APIRouter(prefix="/v1")


def require_json(request: Request) -> None:
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "Content-Type must be application/json")


def request_hash(body: brief.Brief) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def links(pipeline_id: str) -> api.Links:
    return api.Links(self=f"/v1/pipelines/{pipeline_id}", events=f"/v1/pipelines/{pipeline_id}/events")


@router.post(
    "/pipelines",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=api.PipelineAccepted,
    dependencies=[Depends(require_json)],
    responses={409: {"model": api.Problem}, 413: {"model": api.Problem}, 415: {"model": api.Problem}},
)
def create_pipeline(body: brief.Brief, key: IdempotencyKey, gw: GatewayDep) -> api.PipelineAccepted:
    """Accept a brief; publishes pipeline.requested. Replays of the same key and body are answered alike."""
    digest = request_hash(body)
    pipeline_id = uuid.uuid4()
    with db.transaction(gw.engine) as conn:
        created = repository.create_pipeline(conn, pipeline_id, key, digest, body.model_dump(mode="json"))
        if created.new:
            requested = events.PipelineRequested(
                pipeline_id=str(pipeline_id), brief=body, requested_at=dt.datetime.now(dt.UTC)
            )
            env = outbox.add(conn, requested, events.PIPELINE_REQUESTED, SOURCE)
            projection.record_request(conn, pipeline_id, env)
    if created.request_hash != digest:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"Idempotency-Key {key!r} was already used with a different request body; use a new key",
        )
    with gw.engine.connect() as conn:
        row = repository.get_pipeline(conn, created.pipeline_id)
    assert row is not None
    return api.PipelineAccepted(
        id=str(created.pipeline_id), status=row.status, created=created.new, links=links(str(created.pipeline_id))
    )


def _view(row: Any, stage_rows: list[Any]) -> api.PipelineView:
    pid = str(row.id)
    by_stage = {stage_row.stage: stage_row for stage_row in stage_rows}
    stages = []
    for stage in events.STAGE_ORDER:
        s = by_stage.get(stage.value)
        artifact = None
        if s is not None and s.artifact:
            artifact = api.ArtifactLink(**s.artifact, download=f"/v1/pipelines/{pid}/artifacts/{stage.value}")
        stages.append(
            api.StageView(
                stage=stage,
                status=s.status if s else model.StageStatus.PENDING.value,
                attempts=s.attempt if s else 0,
                max_attempts=s.max_attempts if s else None,
                last_error_code=s.last_error_code if s else None,
                last_error_message=s.last_error_message if s else None,
                next_attempt_at=s.next_attempt_at if s else None,
                started_at=s.started_at if s else None,
                finished_at=s.finished_at if s else None,
                artifact=artifact,
            )
        )
    return api.PipelineView(
        id=pid,
        status=row.status,
        progress=row.progress,
        current_stage=row.current_stage,
        error_code=row.error_code,
        error_message=row.error_message,
        brief=row.brief,
        created_at=row.created_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
        stages=stages,
        links=links(pid),
    )


def _load(gw: Gateway, pipeline_id: uuid.UUID) -> api.PipelineView:
    with gw.engine.connect() as conn:
        row = repository.get_pipeline(conn, pipeline_id)
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no pipeline {pipeline_id}")
        return _view(row, repository.get_stages(conn, [pipeline_id])[pipeline_id])


@router.get("/pipelines/{pipeline_id}", response_model=api.PipelineView, responses={404: {"model": api.Problem}})
def get_pipeline(pipeline_id: uuid.UUID, gw: GatewayDep) -> api.PipelineView:
    """Overall status and, per stage, status, attempts, last error, times and artifact."""
    return _load(gw, pipeline_id)


def _encode_cursor(row: Any) -> str:
    return base64.urlsafe_b64encode(f"{row.created_at.isoformat()}|{row.id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[dt.datetime, uuid.UUID]:
    try:
        created, pid = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return dt.datetime.fromisoformat(created), uuid.UUID(pid)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "cursor: not a cursor this API returned") from None


@router.get("/pipelines", response_model=api.PipelinePage)
def list_pipelines(
    gw: GatewayDep,
    status_: Annotated[model.PipelineStatus | None, Query(alias="status")] = None,
    stage: events.Stage | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    cursor: str | None = None,
) -> api.PipelinePage:
    """Newest first, filtered by overall status and by the stage a pipeline is at."""
    limit = min(limit, gw.config.page_size_max)
    after = _decode_cursor(cursor) if cursor else None
    with gw.engine.connect() as conn:
        rows = repository.list_pipelines(conn, status_, stage, after, limit + 1)
        page = rows[:limit]
        stage_rows = repository.get_stages(conn, [row.id for row in page])
    next_cursor = _encode_cursor(page[-1]) if len(rows) > limit else None
    return api.PipelinePage(items=[_view(row, stage_rows[row.id]) for row in page], next_cursor=next_cursor)


@router.get("/pipelines/{pipeline_id}/events", responses={404: {"model": api.Problem}})
async def pipeline_events(
    pipeline_id: uuid.UUID,
    gw: GatewayDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    """Server-Sent Events: step, status, progress, attempt; artifacts on the final event. Resumable."""
    after = 0
    if last_event_id:
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
        if not re.fullmatch(r"[0-9]{1,18}", last_event_id):
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "Last-Event-ID: must be an id this stream sent")
        after = int(last_event_id)
    await run_in_threadpool(_load, gw, pipeline_id)
    return EventSourceResponse(_stream(gw, pipeline_id, after), ping=gw.config.sse_ping_s)


async def _stream(gw: Gateway, pipeline_id: uuid.UUID, after: int) -> AsyncIterator[dict[str, Any]]:
    while True:
        # Subscribed before the read, so that a projection committed after it still wakes the wait.
        with gw.notifications.subscribe(str(pipeline_id)) as grown:
            rows, terminal = await run_in_threadpool(_timeline, gw.engine, pipeline_id, after)
            for row in rows:
                after = row.seq
                yield {"id": str(row.seq), "event": "progress", "data": json.dumps(row.data, ensure_ascii=False)}
            if terminal and not rows:
                return
            if not rows:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(grown.wait(), gw.config.sse_poll_s)


def _timeline(engine: sa.Engine, pipeline_id: uuid.UUID, after: int) -> tuple[list[Any], bool]:
    with engine.connect() as conn:
        row = repository.get_pipeline(conn, pipeline_id)
        terminal = row is not None and model.PipelineStatus(row.status).terminal
        return repository.timeline_after(conn, pipeline_id, after), terminal


@router.get("/pipelines/{pipeline_id}/artifacts/{stage}", responses={404: {"model": api.Problem}})
def download_artifact(pipeline_id: uuid.UUID, stage: events.Stage, gw: GatewayDep) -> FileResponse:
    """The file a stage produced."""
    view = _load(gw, pipeline_id)
    artifact = next(s.artifact for s in view.stages if s.stage is stage)
    if artifact is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{stage.value} has no artifact yet")
    try:
        path = gw.store.path(artifact)
    except ValueError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{stage.value} artifact is not stored here") from None
    if not path.exists():
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{stage.value} artifact file is missing")
    media_type = artifact.media_type
    return FileResponse(path, media_type=media_type, filename=f"{pipeline_id}-{stage.value}{path.suffix}")


health = APIRouter()


@health.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@health.get("/readyz")
def readyz(gw: GatewayDep) -> JSONResponse:
    """Its database and RabbitMQ are reachable."""
    checks = {"database": _check_database(gw.engine), "rabbitmq": _check_rabbitmq(gw.config.amqp_url)}
    ready = all(value == "ok" for value in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks},
        status_code=status.HTTP_200_OK if ready else status.HTTP_503_SERVICE_UNAVAILABLE,
    )


def _check_database(engine: sa.Engine) -> str:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return "ok"
    except sa.exc.SQLAlchemyError as error:
        return f"unreachable: {type(error).__name__}"


def _check_rabbitmq(url: str) -> str:
    parameters = pika.URLParameters(url)
    parameters.socket_timeout = 2
    parameters.blocked_connection_timeout = 2
    try:
        pika.BlockingConnection(parameters).close()
        return "ok"
    except pika.exceptions.AMQPError as error:
        return f"unreachable: {type(error).__name__}"


def create_app(gw: Gateway, lifespan: Any = None) -> FastAPI:
    app = FastAPI(
        title="Castad",
        version="1",
        summary="A brief about a local business in; lyrics, a song and a video out.",
        lifespan=lifespan,
    )
    app.state.gateway = gw
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.include_router(router)
    app.include_router(health)
    app.add_middleware(BodyLimit, max_bytes=gw.config.max_body_bytes)
    return app


async def _invalid_request(_: Request, exc: Exception) -> Response:
    """FastAPI's 422, made safe for any input it echoes back. FastAPI's own handler answers with a 500
    when an input holds a lone surrogate ("\\ud800" in the JSON: UTF-8 cannot encode it, so the body
    is ASCII-escaped) or is Infinity (`1e400`: strict JSON has no such number, so inputs are left out)."""
    assert isinstance(exc, RequestValidationError)
    detail = jsonable_encoder(exc.errors())
    try:
        body = json.dumps({"detail": detail}, ensure_ascii=True, allow_nan=False)
    except ValueError:
        detail = [{key: value for key, value in error.items() if key != "input"} for error in detail]
        body = json.dumps({"detail": detail}, ensure_ascii=True, allow_nan=False)
    return Response(body, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, media_type="application/json")


class BodyLimit:
    """413 for request bodies over the limit, declared or streamed."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await _too_large(self.max_bytes, send)
            return
        received = 0

        async def limited_receive() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge(self.max_bytes)
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _BodyTooLarge:
            await _too_large(self.max_bytes, send)


class _BodyTooLarge(HTTPException):
    """Raised while the body is read. An HTTPException, because FastAPI turns any other exception
    from reading the body into a 400; this one it re-raises, and it is answered as this 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(status.HTTP_413_CONTENT_TOO_LARGE, f"request body larger than {max_bytes} bytes")


async def _too_large(max_bytes: int, send: Any) -> None:
    body = json.dumps({"detail": f"request body larger than {max_bytes} bytes"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
