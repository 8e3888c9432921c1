"""The console's static files as the gateway serves them.

Without a key, outside the OpenAPI document, with a strict Content-Security-Policy; and a guard on the files
themselves: no inline script or style, and no data ever put into the page as HTML.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import re

import httpx
import sqlalchemy as sa
from castad_api import app, deps, notifications, settings
from castad_api.routes import console as console_routes
from castad_contracts import topology
from castad_runtime.artifacts import volume

FILES = console_routes.FILES
HTML_SINKS = re.compile(r"\.(innerHTML|outerHTML|insertAdjacentHTML)\b|document\.write|\beval\(|new Function\(")


def gateway(tmp_path: pathlib.Path) -> deps.Gateway:
    config = settings.ApiSettings()
    return deps.Gateway(
        config=config,
        engine=sa.create_engine(config.database_url),  # never connected: static files need no database
        notifications=notifications.PipelineNotifications(config.database_url),
        store=volume.VolumeStore(tmp_path),
    )


def fetch(tmp_path: pathlib.Path, *paths: str) -> list[httpx.Response]:
    async def requests() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app.create_app(gateway(tmp_path)))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return [await client.get(path) for path in paths]

    return asyncio.run(requests())


def test_the_console_is_served_without_a_key_with_a_strict_policy_and_outside_the_document(tmp_path):
    bare, page, module, style, missing, document = fetch(
        tmp_path, "/ui", "/ui/", "/ui/js/main.js", "/ui/console.css", "/ui/js/nothing.js", "/openapi.json"
    )

    assert bare.status_code == 307 and bare.headers["location"] == "http://gateway/ui/"
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="js/main.js"></script>' in page.text
    policy = dict(directive.split(" ", 1) for directive in page.headers["content-security-policy"].split("; "))
    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == policy["style-src"] == policy["connect-src"] == "'self'"
    assert policy["media-src"] == "blob:" and policy["frame-ancestors"] == "'none'"
    assert policy["img-src"] == "'self' blob:"  # the photos' thumbnails, fetched with the key
    assert page.headers["x-content-type-options"] == "nosniff"
    assert module.status_code == 200 and "javascript" in module.headers["content-type"]
    assert module.headers["content-security-policy"] == page.headers["content-security-policy"]
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    assert missing.status_code == 404
    assert not [path for path in document.json()["paths"] if path.startswith("/ui")]


def test_with_an_object_store_the_console_may_fetch_from_where_downloads_redirect(monkeypatch):
    volume = console_routes.content_security_policy(settings.ApiSettings())
    monkeypatch.setenv("CASTAD_ARTIFACTS_STORE", "s3")
    monkeypatch.setenv("CASTAD_ARTIFACTS_S3_BUCKET", "castad")
    aws = console_routes.content_security_policy(settings.ApiSettings())
    monkeypatch.setenv("CASTAD_ARTIFACTS_S3_ENDPOINT_URL", "http://minio.internal:9000/some/path")
    minio = console_routes.content_security_policy(settings.ApiSettings())

    assert "connect-src 'self';" in volume
    assert "connect-src 'self' https://*.amazonaws.com;" in aws
    assert "connect-src 'self' http://minio.internal:9000;" in minio


def test_no_script_or_style_is_inline_and_no_data_reaches_the_page_as_html():
    scripts = sorted(FILES.glob("js/*.js"))
    assert scripts, FILES
    for script in scripts:
        found = HTML_SINKS.findall(script.read_text())
        assert found == [], (script.name, found)
    page = (FILES / "index.html").read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)", page) == []  # every script comes from a file
    assert re.findall(r"\sstyle=|\son\w+=", page) == []


def test_the_statuses_and_stages_the_console_names_come_from_the_contracts_not_from_its_files(tmp_path):
    (served,) = fetch(tmp_path, "/ui/js/vocabulary.js")

    assert served.status_code == 200 and "javascript" in served.headers["content-type"]
    assert served.headers["content-security-policy"] == console_routes.content_security_policy(settings.ApiSettings())
    assert f"export const STAGES = {json.dumps(list(topology.STAGES))};" in served.text
    assert 'export const ENDED = ["SUCCEEDED", "FAILED", "CANCELED"];' in served.text
    assert not (FILES / "js" / "vocabulary.js").exists()  # written by the gateway, never kept beside the others
    written_again = re.compile(r'\[\s*"(PENDING|lyric|dead)"')
    assert [path.name for path in FILES.glob("js/*.js") if written_again.search(path.read_text())] == []
