"""OpenTelemetry set-up and W3C trace context carried in envelopes.

Exporting follows the standard variables: spans go to OTLP over HTTP when
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set and
OTEL_TRACES_EXPORTER is not "none"; OTEL_SERVICE_NAME overrides the service name.

A service that exports no spans records none (its sampler drops them all), while trace and
span ids still pass from hop to hop: a pipeline keeps its trace id (the timeline shows it)
without the cost of building spans nobody will see. The context it passes on is then marked
unsampled, so services after it record nothing of that trace either: tracing is on or off
for a whole installation (the charts' `global.otel`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from collections.abc import Iterator

from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_provider: TracerProvider | None = None
_W3C = TraceContextTextMapPropagator()  # envelopes carry W3C trace context, whatever OTEL_PROPAGATORS says


def setup(service: str) -> None:
    global _provider
    if _provider is not None:
        return
    name = os.environ.get("OTEL_SERVICE_NAME") or f"castad-{service}"
    # HTTP spans in OpenTelemetry's stable conventions (http.request.method, http.response.status_code, ...).
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
    resource = {"service.name": name, "service.namespace": "castad", "service.version": _version(service)}
    exporting = _otlp_wanted()
    # None: the standard choice (OTEL_TRACES_SAMPLER, by default parent-based, always on).
    sampler = None if exporting else sampling.ALWAYS_OFF
    provider = TracerProvider(resource=Resource.create(resource), sampler=sampler)
    if exporting:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider = provider


def _version(service: str) -> str:
    try:
        return importlib.metadata.version(f"castad-{service}")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


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
