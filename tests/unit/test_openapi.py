"""The gateway's OpenAPI document: every endpoint with its errors, every request body with an example."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import httpx
import sqlalchemy as sa
from castad_api import app, deps, notifications, settings
from castad_runtime.artifacts import volume
from fastapi import FastAPI


def gateway_app(tmp_path: pathlib.Path, **config: Any) -> FastAPI:
    settings_ = settings.ApiSettings(**config)
    gateway = deps.Gateway(
        config=settings_,
        engine=sa.create_engine(settings_.database_url),  # never connected: only the document is built
        notifications=notifications.PipelineNotifications(settings_.database_url),
        store=volume.VolumeStore(tmp_path),
    )
    return app.create_app(gateway)


def openapi(tmp_path: pathlib.Path) -> dict:
    return gateway_app(tmp_path).openapi()


def test_every_operator_endpoint_is_documented_with_its_errors(tmp_path):
    paths = openapi(tmp_path)["paths"]
    expected = {
        ("post", "/v1/pipelines/{pipeline_id}/cancel"): {"202", "404", "409", "422"},
        ("post", "/v1/pipelines/{pipeline_id}/retry"): {"202", "404", "409", "422"},
        ("get", "/v1/dead-letters"): {"200", "422"},
        ("get", "/v1/dead-letters/{letter_id}"): {"200", "404", "422"},
        ("post", "/v1/dead-letters/{letter_id}/replay"): {"202", "404", "409", "422"},
        ("post", "/v1/dead-letters/replay"): {"202", "422"},
        ("post", "/v1/dead-letters/{letter_id}/discard"): {"200", "404", "422"},
        ("get", "/v1/pipelines/{pipeline_id}/timeline"): {"200", "401", "403", "404", "422"},
        ("get", "/v1/stats"): {"200", "401", "403", "422"},
        ("get", "/v1/events"): {"200", "401", "403", "422"},
        ("get", "/v1/me"): {"200", "401"},
    }
    for (method, path), statuses in expected.items():
        operation = paths[path][method]
        assert statuses <= set(operation["responses"]), (method, path, set(operation["responses"]))
        assert operation.get("description") or operation.get("summary"), (method, path)


def test_every_request_body_of_an_action_has_an_example(tmp_path):
    schemas = openapi(tmp_path)["components"]["schemas"]
    for name in ("CancelRequest", "RetryRequest", "DeadLetterFilter", "Discard"):
        assert schemas[name].get("examples"), name


def statuses(application: FastAPI, *paths: str) -> dict[str, int]:
    async def requests() -> dict[str, int]:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return {path: (await client.get(path)).status_code for path in paths}

    return asyncio.run(requests())


def test_the_docs_pages_are_off_unless_asked_for_and_the_document_is_always_served(tmp_path):
    # Swagger UI and ReDoc load their scripts and styles from a public CDN into the gateway's origin, the console's.
    pages = ("/docs", "/redoc", "/docs/oauth2-redirect", "/openapi.json")
    assert statuses(gateway_app(tmp_path), *pages) == {
        "/docs": 404,
        "/redoc": 404,
        "/docs/oauth2-redirect": 404,
        "/openapi.json": 200,
    }
    assert set(statuses(gateway_app(tmp_path, docs=True), *pages).values()) == {200}
