"""The operator console: static files (HTML, one CSS, ES modules; no build step) served at /ui.

One module is written here rather than kept as a file: js/vocabulary.js, the statuses (and which of them a cancel
or a retry takes), stages and dead letters' states the pages name, from the contracts and the gateway's model, so
the console never lists them again.

The page itself needs no key: it asks for one and sends it with every API call it makes, so the
files say nothing about any tenant. They are not part of the OpenAPI document. Every answer
carries a strict Content-Security-Policy: scripts and styles from the gateway only (no inline
script), API calls to the gateway only (and, with an object store, to the store its downloads
redirect to), media and images (the brief's photos) from the object URLs the page makes of what it downloaded
with its key.
"""

from __future__ import annotations

import json
import pathlib
import urllib.parse
from typing import Any

from castad_contracts import topology
from fastapi import FastAPI
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from castad_api import dead_letters, model
from castad_api import settings as settings_

FILES = pathlib.Path(__file__).parent.parent / "console"  # castad_api/console/
PATH = "/ui"
AWS_S3 = "https://*.amazonaws.com"  # where presigned URLs point without CASTAD_ARTIFACTS_S3_ENDPOINT_URL


def content_security_policy(config: settings_.ApiSettings) -> str:
    """The console's policy.

    A download may answer 307 to a presigned URL of the object store, which the page's fetch follows: the store's
    origin is then allowed to be fetched from as well.
    """
    connect = ["'self'"]
    if config.artifacts_store == "s3":
        endpoint = config.artifacts_s3_endpoint_url
        if endpoint is None:
            connect.append(AWS_S3)
        else:
            parsed = urllib.parse.urlsplit(endpoint)
            connect.append(f"{parsed.scheme}://{parsed.netloc}")
    directives = {
        "default-src": "'none'",
        "script-src": "'self'",
        "style-src": "'self'",
        "img-src": "'self' blob:",
        "media-src": "blob:",
        "connect-src": " ".join(connect),
        "base-uri": "'none'",
        "form-action": "'none'",
        "frame-ancestors": "'none'",
    }
    return "; ".join(f"{name} {value}" for name, value in directives.items())


def vocabulary() -> str:
    """Return js/vocabulary.js: what the console names, in the order the contracts and the model give it."""
    names = {
        "STATUSES": [status.value for status in model.PipelineStatus],
        "IN_FLIGHT": [status.value for status in model.PipelineStatus if not status.terminal],
        "ENDED": [status.value for status in model.PipelineStatus if status.terminal],
        "AWAITING_REVIEW": model.PipelineStatus.AWAITING_REVIEW.value,  # a draft waits for a person's decision
        "CANCELABLE": [status.value for status in model.PipelineStatus if status in model.CANCELABLE],
        "RETRYABLE": [status.value for status in model.PipelineStatus if status in model.RETRYABLE],
        "STAGES": list(topology.STAGES),
        "LETTER_STATUSES": list(dead_letters.DEAD_LETTER_STATUSES),
    }
    lines = [f"export const {name} = {json.dumps(value)};" for name, value in names.items()]
    return (
        "// What the console names, written by the gateway from Castad's contracts (castad_api.routes.console).\n\n"
        + ("\n".join(lines) + "\n")
    )


def _headers(policy: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-security-policy", policy.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"cache-control", b"no-cache"),  # revalidated (ETag) at every load: a new version shows at once
    ]


class ConsoleFiles:
    """The console's files (index.html for the folder) with the console's security headers."""

    def __init__(self, policy: str) -> None:
        self.files = StaticFiles(directory=FILES, html=True)
        self.headers = _headers(policy)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.files(scope, receive, with_headers)


def mount(app: FastAPI, config: settings_.ApiSettings) -> None:
    """Serve the console at /ui/ (/ui redirects there). Neither it nor its vocabulary is in the OpenAPI document."""
    policy = content_security_policy(config)
    written = vocabulary()
    headers = {name.decode(): value.decode() for name, value in _headers(policy)}

    @app.get(f"{PATH}/js/vocabulary.js", include_in_schema=False)
    def _vocabulary() -> Response:  # before the mount, which would answer 404 for a file it does not hold
        return Response(written, media_type="text/javascript", headers=headers)

    app.mount(PATH, ConsoleFiles(policy), name="console")
