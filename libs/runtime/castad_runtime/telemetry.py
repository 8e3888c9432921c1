"""OpenTelemetry set-up and W3C trace context carried in envelopes.

Exporting follows the standard variables: spans go to OTLP over HTTP when
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set and
OTEL_TRACES_EXPORTER is not "none"; OTEL_SERVICE_NAME overrides the service name.

A service that exports no spans records none (its sampler drops them all), while trace and
span ids still pass from hop to hop: a pipeline keeps its trace id (the timeline shows it)
without the cost of building spans nobody will see. The context it passes on is then marked
unsampled, so services after it record nothing of that trace either: tracing is on or off
for a whole installation (the charts' `global.otel`).

No span leaves a process unmasked: every attribute, event, link, name and status of an exported
span passes through redact.mask (`exporting`), since the instrumentations record what came
(the gateway's `url.query` holds a link's signature, whatever OpenTelemetry's case-sensitive list
of sensitive parameters says), and an exception's message may hold a URL. Captured HTTP headers,
if an operator turns their capture on, are sanitized by the instrumentations' own
OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS, which defaults here to the ones that
carry credentials.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.status import Status
from opentelemetry.util import types

from castad_runtime import redact, release

# Header names (regular expressions, any case) whose captured values the HTTP instrumentations replace.
SANITIZED_HEADERS = "authorization,proxy-authorization,cookie,set-cookie,x-api-key,.*token.*,.*secret.*,.*signature.*"
_provider: TracerProvider | None = None
_W3C = TraceContextTextMapPropagator()  # envelopes carry W3C trace context, whatever OTEL_PROPAGATORS says


def setup(service: str) -> None:
    global _provider
    if _provider is not None:
        return
    name = os.environ.get("OTEL_SERVICE_NAME") or f"castad-{service}"
    # HTTP spans in OpenTelemetry's stable conventions (http.request.method, http.response.status_code, ...).
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
    os.environ.setdefault("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS", SANITIZED_HEADERS)
    resource = {"service.name": name, "service.namespace": "castad", "service.version": release.of(service)}
    wanted = _otlp_wanted()
    # None: the standard choice (OTEL_TRACES_SAMPLER, by default parent-based, always on).
    sampler = None if wanted else sampling.ALWAYS_OFF
    provider = TracerProvider(resource=Resource.create(resource), sampler=sampler)
    if wanted:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(exporting(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider = provider


def exporting(exporter: SpanExporter) -> SpanProcessor:
    """Return the processor that sends ended spans to `exporter` in batches, each masked first."""
    return BatchSpanProcessor(MaskingExporter(exporter))


class MaskingExporter(SpanExporter):
    """Hand spans on to another exporter with every credential in them masked (redact.mask).

    Spans are read-only once ended and the SDK has no hook before that (opentelemetry-python#4424),
    so a masked span is a copy, made only when something in it was masked."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self._inner.export([_masked(span) for span in spans])

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


def _masked(span: ReadableSpan) -> ReadableSpan:
    attributes = _masked_attributes(span.attributes)
    events = [Event(e.name, _masked_attributes(e.attributes), e.timestamp) for e in span.events]
    links = [trace.Link(link.context, _masked_attributes(link.attributes)) for link in span.links]
    name, description = redact.mask(span.name), span.status.description
    masked_description = redact.mask(description) if description else description
    if (
        attributes == span.attributes
        and name == span.name
        and masked_description == description
        and all(e.attributes == m.attributes for e, m in zip(span.events, events, strict=True))
        and all(link.attributes == m.attributes for link, m in zip(span.links, links, strict=True))
    ):
        return span
    return ReadableSpan(
        name=name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=events,
        links=links,
        kind=span.kind,
        status=Status(span.status.status_code, masked_description) if description else span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _masked_attributes(attributes: types.Attributes) -> types.Attributes:
    if not attributes:
        return attributes
    masked: dict[str, types.AttributeValue] = {}
    for key, value in attributes.items():
        if isinstance(value, str):
            masked[key] = redact.mask(value)
        elif isinstance(value, Sequence) and value and all(isinstance(item, str) for item in value):
            masked[key] = [redact.mask(str(item)) for item in value]
        else:
            masked[key] = value
    return masked


def _otlp_wanted() -> bool:
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp") == "none":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def shutdown() -> None:
    """Flush spans still buffered; call before the process exits."""
    if _provider is not None:
        _provider.shutdown()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def current_trace_headers(span: trace.Span | None = None) -> tuple[str | None, str | None]:
    """traceparent and tracestate of the current span, or of `span`."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=None if span is None else trace.set_span_in_context(span))
    return carrier.get("traceparent"), carrier.get("tracestate")


def context_from(traceparent: str | None, tracestate: str | None) -> context.Context:
    carrier = {k: v for k, v in (("traceparent", traceparent), ("tracestate", tracestate)) if v}
    return _W3C.extract(carrier)


@contextlib.contextmanager
def continued(traceparent: str | None, tracestate: str | None) -> Iterator[None]:
    """Make the given remote context current for the block."""
    token = context.attach(context_from(traceparent, tracestate))
    try:
        yield
    finally:
        context.detach(token)


def current_trace_id() -> str | None:
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None
