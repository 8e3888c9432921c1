"""The gateway's metrics.

Its HTTP requests by route template, pipelines created, the projection's events, open event streams, and (read at
scrape time) its recorded dead letters and its queues on the broker.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from castad_contracts import api, topology
from castad_runtime import metrics, scrape
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from castad_api import dead_letters, reviews, usage

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"  # a path no route takes: its template is unknown, and the path itself is free text

# What became of an event the projection was given (castad_api.projection).
APPLIED = "applied"
STALE = "stale"  # older than what the read model shows of its stage: ignored
UNKNOWN_PIPELINE = "unknown_pipeline"  # a pipeline this gateway never accepted
AUTH_FAILURES = ("missing", "malformed", "unknown", "throttled")  # castad_api.auth.Failure


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or metrics.registry()
        self.consumer = metrics.ConsumerMetrics(self.registry, "api")
        self.retention = metrics.RetentionMetrics(self.registry, "api")
        self.requests = Counter(
            "castad_http_requests_total",
            "HTTP requests answered, by method, route template and status class (2xx, 4xx, ...)",
            ["method", "route", "status_class"],
            registry=self.registry,
        )
        self.durations = Histogram(
            "castad_http_request_duration_seconds",
            "From a request's arrival to the end of its answer (an event stream's: when it closes), by route",
            ["method", "route"],
            registry=self.registry,
        )
        self.pipelines_created = Counter(
            "castad_pipelines_created_total",
            "Pipelines accepted (a replayed Idempotency-Key creates none)",
            registry=self.registry,
        )
        self.usage = Counter(
            "castad_usage_total",
            "What tenants used, by tenant (a digest of its name: castad-admin tenants list) and meter (GET"
            " /v1/usage): pipelines made, requests for work sent to each"
            " stage's provider, seconds of song and video made, bytes of files kept",
            ["tenant_ref", "meter"],
            registry=self.registry,
        )
        self.projected = Counter(
            "castad_projection_events_total",
            "Stage events the projection was given, by event type and what became of them",
            ["event_type", "outcome"],
            registry=self.registry,
        )
        self.streams = Gauge(
            "castad_sse_streams_open", "Event streams (Server-Sent Events) open now", registry=self.registry
        )
        self.auth_failures = Counter(
            "castad_api_auth_failures_total",
            "Requests refused for their API key: missing, malformed, unknown (or revoked), or throttled (a failure"
            " of a client address that failed too often: 429)",
            ["reason"],
            registry=self.registry,
        )
        for reason in AUTH_FAILURES:
            self.auth_failures.labels(reason)
        self.integrity_failures = Counter(
            "castad_api_integrity_failures_total",
            "Stored files not served because they are not what their record says (other bytes, another size, a"
            " link or no regular file at the name), or that changed while they were sent",
            registry=self.registry,
        )

    def used(self, tenant: str, amounts: dict[api.Meter, float]) -> None:
        for meter, amount in amounts.items():
            self.usage.labels(usage.metrics_label(tenant), meter.value).inc(amount)

    def answered(self, method: str, route: str, status: int, duration_s: float) -> None:
        method = method if method in METHODS else "other"
        self.requests.labels(method, route, f"{status // 100}xx").inc()
        self.durations.labels(method, route).observe(duration_s)


class RequestMetrics:
    """ASGI middleware counting every HTTP request by the template of the route that took it."""

    def __init__(self, app: Any, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception that escapes without an answer

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or UNMATCHED  # the router sets it once it matched
            self.metrics.answered(scope["method"], route, status, time.perf_counter() - started)


class DeadLetters:
    """Recorded dead letters by status, read from the gateway's table at scrape time."""

    part = "dead_letters"
    ttl_s = 0.0

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def families(self) -> list[Metric]:
        return [self._family()]

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "castad_dead_letters", "Dead letters the gateway recorded, by status", labels=["status"]
        )

    def read(self) -> list[Metric]:
        with self.engine.connect() as conn:
            counts = dead_letters.dead_letter_counts(conn)
        family = self._family()
        for status, count in counts.items():
            family.add_metric([status], count)
        return [family]


class Budgets:
    """Each tenant's budgets used so far in their period, as a share of each limit, read at scrape time."""

    part = "budgets"
    ttl_s = 0.0

    def __init__(self, engine: sa.Engine, prices: usage.Prices) -> None:
        self.engine = engine
        self.prices = prices

    def families(self) -> list[Metric]:
        return [self._family()]

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "castad_budget_used_ratio",
            "A tenant's budget used so far this UTC day or month, as a share of its limit (1: reached); the tenant by"
            " a digest of its name (castad-admin tenants list)",
            labels=["tenant_ref", "period", "limit"],
        )

    def read(self) -> list[Metric]:
        family = self._family()
        with self.engine.connect() as conn:
            for tenant, period, limit, ratio in usage.budget_ratios(conn, self.prices):
                family.add_metric([usage.metrics_label(tenant), period, limit], ratio)
        return [family]


class WaitingReviews:
    """Drafts waiting for a person's decision, and the longest wait, read from the gateway's table at scrape time."""

    part = "reviews"
    ttl_s = 0.0

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def families(self) -> list[Metric]:
        return list(self._families())

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("castad_reviews_waiting", "Drafts waiting for a person's decision"),
            GaugeMetricFamily(
                "castad_review_oldest_wait_seconds", "How long the draft waiting longest for a decision has waited"
            ),
        )

    def read(self) -> list[Metric]:
        with self.engine.connect() as conn:
            waiting, longest_s = reviews.waiting(conn)
        count, oldest = self._families()
        count.add_metric([], waiting)
        oldest.add_metric([], longest_s)
        return [count, oldest]


def instruments(
    database_url: str, amqp_url: str, topo: topology.Topology, prices: usage.Prices | None = None
) -> GatewayMetrics:
    """The gateway's metrics, with the gauges a scrape reads.

    Its dead letters, its queue, its delay queue and the dead-letter queue. Nothing connects until a scrape reads
    them.
    """
    gateway = GatewayMetrics()
    scrape.register(
        gateway.registry,
        [
            DeadLetters(scrape.engine(database_url)),
            WaitingReviews(scrape.engine(database_url)),
            Budgets(scrape.engine(database_url), prices or {}),
            scrape.QueueDepth.of_service(amqp_url, topo.queue("api"), topo.dead_letter_queue),
        ],
    )
    return gateway
