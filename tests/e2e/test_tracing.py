"""One pipeline is one trace.

Spans from all five services, exported over OTLP/HTTP (the wire format Jaeger's collector takes, decoded here with
opentelemetry-proto), share its trace id, link parent to child along the saga, and follow OpenTelemetry's HTTP and
messaging conventions.
"""

from __future__ import annotations

import gzip
import http.server
import json
import threading
from collections.abc import Iterator

import pytest
from castad_contracts import topology
from castad_runtime import release
from castad_testkit import briefs
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1.trace_pb2 import Span

pytestmark = pytest.mark.e2e

SERVICES = ("castad-api", "castad-relay", "castad-lyric", "castad-song", "castad-video")


def _routing_key(span: dict) -> object:
    return span["attributes"].get("messaging.rabbitmq.destination.routing_key")


class Collector(http.server.ThreadingHTTPServer):
    """A minimal OTLP/HTTP trace receiver: POST /v1/traces with a protobuf ExportTraceServiceRequest."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _OtlpHandler)
        self.lock = threading.Lock()
        self.spans: list[dict] = []
        self.rejected: list[str] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def received(self) -> list[dict]:
        with self.lock:
            return list(self.spans)


class _OtlpHandler(http.server.BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            with self.server.lock:
                self.server.rejected.append(f"{self.path} {self.headers.get('Content-Type')}")
            self.send_response(404)
            self.end_headers()
            return
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        {
                            "service": resource.get("service.name"),
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "name": span.name,
                            "kind": span.kind,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "events": [
                                {"name": e.name, "attributes": {a.key: _value(a.value) for a in e.attributes}}
                                for e in span.events
                            ],
                            "status": span.status.message,
                            "resource": resource,
                        }
                    )
        with self.server.lock:
            self.server.spans.extend(spans)
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        pass


def _value(value: common_pb2.AnyValue) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def _log_lines(path) -> list[dict]:
    lines = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
    return lines


@pytest.mark.timeout(120)
def test_one_pipeline_is_one_trace_across_all_five_services(castad, dbs, collector):
    running = castad(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_SERVICE_NAME": "",
        }
    )
    pipeline_id = running.submit(briefs.sample())
    assert running.wait_terminal([pipeline_id])[pipeline_id].status == "SUCCEEDED"

    # The pipeline's trace: the one the gateway put into its pipeline.requested event.
    (requested,) = dbs.outbox_of("api", pipeline_id)
    traceparent = requested["envelope"]["traceparent"]
    assert traceparent, "the gateway recorded no trace context with the request"
    trace_id = traceparent.split("-")[1]
    assert trace_id != "0" * 32

    def in_trace() -> list[dict]:
        return [span for span in collector.received() if span["trace_id"] == trace_id]

    def complete() -> bool:
        """Spans from every service, and every parent received (services export in their own time)."""
        spans = in_trace()
        ids = {s["span_id"] for s in spans}
        parents = {s["parent_span_id"] for s in spans if s["parent_span_id"]}
        return {s["service"] for s in spans} >= set(SERVICES) and parents <= ids

    running.wait_until(f"the spans of trace {trace_id} from {SERVICES}", complete, timeout_s=30)
    # Stopping every service flushes what their batch span processors still hold.
    running.close()
    spans = in_trace()
    assert collector.rejected == []
    assert {s["service"] for s in spans} == set(SERVICES)

    # Every span about this pipeline is in its trace, and the trace is one tree rooted at the POST.
    about = [s for s in collector.received() if s["attributes"].get("castad.pipeline_id") == pipeline_id]
    assert about and {s["trace_id"] for s in about} == {trace_id}
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if not s["parent_span_id"]]
    assert [(r["service"], r["name"]) for r in roots] == [("castad-api", "POST /v1/pipelines")], roots
    orphans = [s for s in spans if s["parent_span_id"] and s["parent_span_id"] not in ids]
    assert orphans == []
    for span in spans:
        assert span["resource"]["service.name"] == span["service"]
        assert span["resource"]["service.namespace"] == "castad" and span["resource"]["service.version"] == release.of(
            "api"
        )

    # The saga, parent to child: from the gateway's handling of video.completed up to the POST.
    by_id = {s["span_id"]: s for s in spans}
    (last,) = [s for s in spans if s["service"] == "castad-api" and _routing_key(s) == "video.completed"]
    path: list[dict] = []
    span: dict | None = last
    while span is not None:
        path.insert(0, span)
        span = by_id.get(span["parent_span_id"])
    hops = [
        service for i, service in enumerate(s["service"] for s in path) if i == 0 or path[i - 1]["service"] != service
    ]
    assert hops == [
        "castad-api", "castad-relay", "castad-lyric", "castad-relay", "castad-song",
        "castad-relay", "castad-video", "castad-relay", "castad-api",
    ], [(s["service"], s["name"]) for s in path]  # fmt: skip

    # HTTP server span (stable HTTP conventions).
    (post,) = [s for s in spans if s["kind"] == Span.SPAN_KIND_SERVER]
    assert post["name"] == "POST /v1/pipelines"
    assert post["attributes"]["http.request.method"] == "POST"
    assert post["attributes"]["http.route"] == "/v1/pipelines"
    assert post["attributes"]["http.response.status_code"] == 202

    # Messaging spans: "{operation} {destination}", the exchange as the destination.
    exchange = running.installation.topology.exchange
    producers = [s for s in spans if s["kind"] == Span.SPAN_KIND_PRODUCER]
    consumers = [s for s in spans if s["kind"] == Span.SPAN_KIND_CONSUMER]
    published = {_routing_key(s) for s in producers}
    assert published == {
        "pipeline.requested",
        *(f"{stage}.{fact}" for stage in topology.STAGES for fact in ("started", "completed")),
    }
    for span in producers:
        assert span["service"] == "castad-relay" and span["name"] == f"publish {exchange}"
        assert span["attributes"]["messaging.operation.name"] == "publish"
        assert span["attributes"]["messaging.operation.type"] == "send"
    for span in consumers:
        assert span["name"] == f"process {exchange}"
        assert span["attributes"]["messaging.operation.type"] == "process"
        assert span["attributes"]["messaging.destination.subscription.name"].endswith(span["service"].split("-")[1])
    for span in producers + consumers:
        assert span["attributes"]["messaging.system"] == "rabbitmq"
        assert span["attributes"]["messaging.destination.name"] == exchange
        assert span["attributes"]["messaging.message.id"]
    names = {(s["service"], s["name"]) for s in spans}
    for stage in topology.STAGES:
        assert (f"castad-{stage}", f"{stage} attempt") in names

    # The services' JSON logs about this pipeline carry the same trace id.
    for stage in topology.STAGES:
        lines = [line for line in _log_lines(running.services.log_dir / f"{stage}.log")]
        mine = [line for line in lines if line.get("pipeline_id") == pipeline_id]
        assert mine, f"no {stage} log line about {pipeline_id}"
        assert {line.get("trace_id") for line in mine} == {trace_id}, (stage, mine)
