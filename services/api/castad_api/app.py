"""The gateway's HTTP API: its routers, its errors mapped to statuses in one place, health, metrics.

The probes and `/metrics` are served on the API port, or with CASTAD_API_HEALTH_PORT on that port alone
(`probe_server`), which a chart keeps inside the cluster as the stages' is: the public port then serves no
unauthenticated work but the console's static files. Readiness is cached and checks on connections the
gateway keeps (deps.Gateway.readiness), so a probe never opens one.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from typing import Any

import psycopg
import sqlalchemy as sa
from castad_contracts import topology
from castad_runtime import health as castad_health
from castad_runtime import metrics as castad_metrics
from castad_runtime import outages, release
from fastapi import APIRouter, FastAPI, HTTPException, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from castad_api import buckets, errors
from castad_api import metrics as metrics_
from castad_api.deps import Gateway, GatewayDep
from castad_api.routes import (
    brand,
    console,
    dead_letters,
    downloads,
    images,
    keys,
    pipeline_views,
    pipelines,
    reviews,
    stats,
    timeline,
    usage,
    webhooks,
)

log = logging.getLogger(__name__)
RETRY_AFTER_S = 2  # what a client is told to wait when the database is out


health = APIRouter()


@health.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is alive, and the release it runs."""
    return {"status": "ok", "release": release.of(topology.GATEWAY)}


@health.get(
    "/readyz",
    responses={
        200: {"description": "ready: every check says ok"},
        503: {"description": "not ready: the checks say which part cannot be reached"},
    },
)
def readyz(gw: GatewayDep) -> JSONResponse:
    """Its database and RabbitMQ are reachable (read at most every second or two)."""
    ready, checks = castad_health.run_checks(gw.readiness)
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "checks": checks},
        status_code=status.HTTP_200_OK if ready else status.HTTP_503_SERVICE_UNAVAILABLE,
    )


@health.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus's text format, or OpenMetrics when the Accept header asks for it",
            "content": {"text/plain": {}, "application/openmetrics-text": {}},
        }
    },
)
def metrics(request: Request, gw: GatewayDep) -> Response:
    """The gateway's metrics for Prometheus (no key: like the probes, they name no pipeline and no tenant).

    A plain function: FastAPI runs it on a thread, so the database and broker reads of a scrape never hold up the
    event loop.
    """
    body, content_type = castad_metrics.exposition(gw.metrics.registry, request.headers.get("accept"))
    return Response(body, media_type=content_type)


def probe_server(gw: Gateway, liveness: Mapping[str, castad_health.Check]) -> castad_health.ProbeServer | None:
    """The probes and metrics on CASTAD_API_HEALTH_PORT (None when unset: they are on the API port)."""
    if gw.config.health_port is None:
        return None
    return castad_health.ProbeServer(
        gw.config.health_port,
        liveness,
        gw.readiness,
        registry=gw.metrics.registry,
        release=release.of(topology.GATEWAY),
    )


def create_app(gw: Gateway, lifespan: Any = None) -> FastAPI:
    app = FastAPI(
        title="Castad",
        version="1",
        summary="A brief about a local business in; lyrics, a song and a video out.",
        lifespan=lifespan,
        # Their pages run a CDN's scripts in the console's origin: only when asked for (CASTAD_API_DOCS).
        docs_url="/docs" if gw.config.docs else None,
        redoc_url="/redoc" if gw.config.docs else None,
    )
    app.state.gateway = gw
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(errors.GatewayError, _refused)
    for database_error in (sa.exc.SQLAlchemyError, psycopg.Error):
        app.add_exception_handler(database_error, _unavailable)
    app.add_exception_handler(outages.StoreUnavailable, _store_unavailable)
    for routes in (
        pipelines,
        pipeline_views,
        downloads,
        webhooks,
        images,
        timeline,
        stats,
        dead_letters,
        keys,
        brand,
        reviews,
        usage,
    ):
        app.include_router(routes.router)
    if gw.config.health_port is None:
        app.include_router(health)
    console.mount(app, gw.config)
    image_upload = gw.config.image_max_bytes + images.MULTIPART_OVERHEAD_BYTES
    app.add_middleware(BodyLimit, max_bytes=gw.config.max_body_bytes, larger={images.UPLOAD_PATH: image_upload})
    app.add_middleware(metrics_.RequestMetrics, metrics=gw.metrics)  # outermost: counts the 413s too
    return app


async def _invalid_request(_: Request, exc: Exception) -> Response:
    """FastAPI's 422, made safe for any input it echoes back.

    FastAPI's own handler answers with a 500 when an input holds a lone surrogate ("\\ud800" in the JSON: UTF-8
    cannot encode it, so the body is ASCII-escaped) or is Infinity (`1e400`: strict JSON has no such number, so
    inputs are left out).
    """
    assert isinstance(exc, RequestValidationError)
    detail = jsonable_encoder(exc.errors())
    try:
        body = json.dumps({"detail": detail}, ensure_ascii=True, allow_nan=False)
    except ValueError:
        detail = [{key: value for key, value in error.items() if key != "input"} for error in detail]
        body = json.dumps({"detail": detail}, ensure_ascii=True, allow_nan=False)
    return Response(body, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, media_type="application/json")


async def _refused(request: Request, exc: Exception) -> Response:
    """What a use case refused, as the status that says why."""
    if isinstance(exc, errors.Conflict):
        return JSONResponse({"detail": str(exc), "status": exc.status}, status_code=status.HTTP_409_CONFLICT)
    if isinstance(exc, errors.Full):
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_409_CONFLICT)
    if isinstance(exc, errors.NotFound):
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, errors.OverBudget):
        wait_s = (exc.resets_at - dt.datetime.now(dt.UTC)).total_seconds()
        return JSONResponse(
            {"detail": str(exc), "resets_at": exc.resets_at.isoformat()},
            status_code=status.HTTP_402_PAYMENT_REQUIRED if exc.payment else status.HTTP_429_TOO_MANY_REQUESTS,
            headers={"Retry-After": buckets.retry_after(wait_s)},
        )
    if isinstance(exc, errors.InvalidField):
        return await _invalid_request(request, errors.invalid(exc.loc, str(exc), exc.given))
    return await _invalid_request(request, errors.invalid(("path",), str(exc)))


async def _unavailable(_: Request, exc: Exception) -> Response:
    """A 503 with Retry-After while the gateway's database is out.

    Nothing was accepted, try again. Any other database error is a bug: a 500, logged with its traceback, its SQL
    kept out of the answer.
    """
    if not outages.is_outage(exc):
        log.error("request failed on a database error", exc_info=exc)
        return JSONResponse({"detail": "internal error"}, status_code=status.HTTP_500_INTERNAL_SERVER_ERROR)
    return JSONResponse(
        {"detail": "the gateway's database is unavailable; nothing was changed, try again shortly"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def _store_unavailable(_: Request, exc: Exception) -> Response:
    """A 503 with Retry-After while the artifact store cannot be reached (a download's link cannot be made)."""
    log.warning("artifact store unavailable: %s", exc)
    return JSONResponse(
        {"detail": "the artifact store is unavailable; try again shortly"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


class BodyLimit:
    """413 for request bodies over the limit, declared or streamed; a POST to a path of `larger` has its own."""

    def __init__(self, app: Any, max_bytes: int, larger: Mapping[str, int] | None = None) -> None:
        self.app = app
        self.default_max_bytes = max_bytes
        self.larger = dict(larger or {})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.default_max_bytes
        if scope.get("method") == "POST":
            max_bytes = self.larger.get(scope.get("path", ""), max_bytes)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_bytes):
            await _too_large(max_bytes, send)
            return
        received = 0

        async def limited_receive() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    raise _BodyTooLarge(max_bytes)
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _BodyTooLarge:
            await _too_large(max_bytes, send)


class _BodyTooLarge(HTTPException):
    """Raised while the body is read.

    An HTTPException, because FastAPI turns any other exception from reading the body into a 400; this one it
    re-raises, and it is answered as this 413.
    """

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
