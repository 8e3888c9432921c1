"""Tracing's set-up: spans are recorded only where they are exported, and trace context passes on either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os
from castad_runtime import telemetry
telemetry.setup("lyric")
tracer = telemetry.tracer("probe")
with tracer.start_as_current_span("root") as root:
    sent, recording = telemetry.current_trace_headers(), [root.is_recording()]
with tracer.start_span("next hop", context=telemetry.context_from(*sent)) as hop:
    passed_on = telemetry.current_trace_headers(hop)
    recording.append(hop.is_recording())
print(json.dumps({"recording": recording, "sent": sent[0], "passed_on": passed_on[0]}))
os._exit(0)  # no flush to the (absent) collector at exit
"""


def probe(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("env", "recording"),
    [
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({}, False),  # no endpoint: nothing to export to
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_PROPAGATORS": "none"}, False),  # envelopes carry W3C's anyway
    ],
    ids=["exporter-none", "no-endpoint", "exporting", "no-global-propagator"],
)
def test_spans_are_recorded_only_when_exported_and_the_trace_goes_on_either_way(env, recording):
    result = probe(**env)

    assert result["recording"] == [recording, recording]
    sent, passed_on = str(result["sent"]).split("-"), str(result["passed_on"]).split("-")
    assert sent[1] == passed_on[1] and int(sent[1], 16) != 0  # the same trace id
    assert sent[2] != passed_on[2]  # the next hop's own span id


def test_no_span_carries_a_links_signature_or_a_key_whatever_its_case(tmp_path, monkeypatch):
    """No span carries a link's signature or a key, whatever its case.

    The gateway's own instrumentation records `url.query` as it came (and headers, when an operator has them
    captured): the spans leave the process masked.
    """
    import asyncio
    import uuid

    import httpx
    from castad_api import app, service
    from castad_runtime import telemetry
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.unit.test_console_files import gateway

    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST", ".*")
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(telemetry.exporting(exported))
    application = app.create_app(gateway(tmp_path))
    service.instrument(application, provider)
    signature, key = "a1b2" * 16, "cad_" + "Zy9" * 14
    path = f"/v1/links/pipelines/{uuid.uuid4()}/artifacts/song"

    async def requests() -> None:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            await client.get(f"{path}?expires=1767225600&Signature={signature}&signature={signature}")
            await client.get(f"{path}?X-Amz-Signature={signature}", headers={"authorization": f"Bearer {key}"})

    asyncio.run(requests())
    provider.force_flush()
    spans = exported.get_finished_spans()

    assert spans, "the gateway recorded no span"
    seen = [str(value) for span in spans for value in span.attributes.values()] + [span.name for span in spans]
    seen += [str(value) for span in spans for event in span.events for value in event.attributes.values()]
    assert any("expires=1767225600" in value for value in seen)  # the query is there, its signature is not
    assert not [value for value in seen if signature in value or key in value]
