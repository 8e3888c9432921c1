"""No secret leaves Castad in its traces or its logs.

One pipeline through the three network providers (the local fakes), with callbacks, signed links and, in a bucket,
presigned URLs; every span every service exported (OTLP, as test_tracing receives it) and every line of every
service's log is scanned for every secret the run used: the API key, the providers' keys, the link keys, and each
link's and presigned URL's signature.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Iterator

import pytest
from castad_local import stack
from castad_local.fakes import chat, creatomate, suno

from tests.e2e.test_languages import BRIEFS
from tests.e2e.test_tracing import Collector
from tests.support import network
from tests.support.links import link_secrets
from tests.support.object_store import ObjectStore

pytestmark = pytest.mark.e2e
WEBHOOK_SECRET = "whsec_Y2FzdGFkIGUyZSBzZWNyZXRzIGtleSAxMjM0NTY="
QUERY_SECRETS = ("signature", "x-amz-signature", "x-amz-security-token")


@pytest.fixture
def otlp() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def providers() -> Iterator[network.Fakes]:
    with network.fakes(song_s=1.0, audio_s=2.0, render_s=0.5) as running:
        yield running


def signatures(url: str) -> set[str]:
    """The values of a URL's query parameters that are signatures or tokens."""
    query = urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query)
    return {value for name, value in query if name.lower() in QUERY_SECRETS and value}


def every_string(span: dict) -> Iterator[str]:
    yield span["name"]
    yield str(span.get("status") or "")
    yield from (str(value) for value in span["attributes"].values())
    for event in span.get("events", []):
        yield event["name"]
        yield from (str(value) for value in event["attributes"].values())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("store", ["volume", "s3"])
def test_no_span_or_log_line_of_a_whole_run_holds_a_secret(
    castad, providers, otlp, store, request: pytest.FixtureRequest
):
    lyrics, music, render = providers
    port = stack.free_port()
    gateway = f"http://127.0.0.1:{port}"
    bucket_env: dict[str, str] = {}
    if store == "s3":
        object_store: ObjectStore = request.getfixturevalue("object_store")
        bucket_env = object_store.env(request.getfixturevalue("bucket"))
    running = castad(
        {
            "CASTAD_API_PORT": str(port),
            **network.env(providers, gateway, first_poll_s=30),  # callbacks move them on
            **bucket_env,
            "CASTAD_API_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "CASTAD_LOG_LEVEL": "DEBUG",  # the most a log says
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_SERVICE_NAME": "",
        }
    )
    pipeline_id = running.submit(BRIEFS[next(iter(BRIEFS))])
    view = running.wait_terminal([pipeline_id], timeout_s=90)[pipeline_id]
    assert view.status == "SUCCEEDED", view

    # What the providers were given, and use as the render API would: links of the gateway, presigned URLs.
    given = [r["body"]["callBackUrl"] for r in music.received if r["path"] == "/api/v1/generate"]
    renders = [r["body"] for r in render.received if r["path"] == "/v2/renders"]
    given += [body["webhook_url"] for body in renders] + [body["modifications"]["Music.source"] for body in renders]
    for url in given:
        if url.startswith(gateway) and "/links/" in url:
            assert running.http.get(url.removeprefix(gateway)).status_code == 200
    downloads = [running.http.get(f"/v1/pipelines/{pipeline_id}/artifacts/{stage}") for stage in ("song", "video")]
    presigned = [answer.headers["location"] for answer in downloads if answer.status_code == 307]
    assert (store == "s3") == bool(presigned)
    running.wait_until("every service's spans", lambda: len({s["service"] for s in otlp.received()}) == 5)
    running.close()  # every batch of spans flushed

    secrets = {running.installation.api_key, chat.DEFAULT_KEY, suno.DEFAULT_KEY, creatomate.DEFAULT_KEY}
    secrets |= set(link_secrets().values()) | {WEBHOOK_SECRET, ObjectStore.ENV["AWS_SECRET_ACCESS_KEY"]}
    signed = set().union(*(signatures(url) for url in given + presigned))
    assert signed, "the run signed no link"
    assert any("signature=" in url for url in given)
    if store == "s3":
        assert any("X-Amz-Signature=" in url for url in given + presigned)

    spans = otlp.received()
    assert otlp.rejected == [] and spans
    # The gateway saw the signed links (the query is in its spans, masked).
    assert any("signature=" in str(s["attributes"].get("url.query", "")) for s in spans)
    leaked = [
        (span["service"], span["name"], text[:200])
        for span in spans
        for text in every_string(span)
        for secret in secrets | signed
        if secret in text
    ]
    assert leaked == []
    for log in sorted(running.services.log_dir.glob("*.log")):
        text = log.read_text(encoding="utf-8", errors="replace")
        found = sorted(secret[:12] + "…" for secret in secrets | signed if secret in text)
        assert found == [], (log.name, found)
