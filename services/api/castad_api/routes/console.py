"""The operator console: static files (HTML, one CSS, ES modules; no build step) served at /ui.

The page itself needs no key: it asks for one and sends it with every API call it makes, so the
files say nothing about any tenant. They are not part of the OpenAPI document. Every answer
carries a strict Content-Security-Policy: scripts and styles from the gateway only (no inline
script), API calls to the gateway only (and, with an object store, to the store its downloads
redirect to), media and images (the brief's photos) from the object URLs the page makes of what it downloaded
with its key.
"""

from __future__ import annotations

import pathlib
import urllib.parse
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

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


class ConsoleFiles:
    """The console's files (index.html for the folder) with the console's security headers."""

    def __init__(self, policy: str) -> None:
        self.files = StaticFiles(directory=FILES, html=True)
        self.headers = [
            (b"content-security-policy", policy.encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
            (b"cache-control", b"no-cache"),  # revalidated (ETag) at every load: a new version shows at once
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.files(scope, receive, with_headers)


def mount(app: FastAPI, config: settings_.ApiSettings) -> None:
    """Serve the console at /ui/ (/ui redirects there). Mounted apps are not in the OpenAPI document."""
    app.mount(PATH, ConsoleFiles(content_security_policy(config)), name="console")
