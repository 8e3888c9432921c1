"""The metrics' own rules, without servers.

Label values stay bounded, a scrape-time reading that fails costs only its own gauges, the probe server and the
gateway serve the Prometheus text, and the gateway counts each request by its route's template.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import httpx
import sqlalchemy as sa
from castad_api import app, deps, notifications, settings
from castad_local import stack
from castad_runtime import health, metrics, scrape
from castad_runtime.artifacts import volume
from prometheus_client.core import GaugeMetricFamily, Metric


def test_an_arbitrary_error_code_becomes_a_label_value_only_within_the_cap():
    registry = metrics.registry()
    stage = metrics.StageMetrics(registry, "song", known_codes={"attempt_timeout"})
    for n in range(metrics.MAX_CODES + 25):
        stage.attempt_ended("failed", f"provider_code_{n}")
    for odd in ("Provider Said No!", "x" * 65, "1starts_with_a_digit", "pipeline 0f3c-..."):
        stage.attempt_ended("failed", odd)
    stage.attempt_ended("failed_retryable", "attempt_timeout")  # the runner's own: never crowded out
    stage.attempt_ended("succeeded", None)

    codes = {
        sample.labels["error_code"]: sample.value
        for family in registry.collect()
        if family.name == "castad_attempts"
        for sample in family.samples
        if sample.name == "castad_attempts_total"
    }
    assert len(codes) == metrics.MAX_CODES + 3  # the first MAX_CODES, other, attempt_timeout, none
    assert codes["other"] == 25 + 4
    assert codes["provider_code_0"] == 1 and "provider_code_50" not in codes
    assert codes["attempt_timeout"] == 1 and codes["none"] == 1


def test_a_code_seen_before_the_cap_keeps_its_own_value_after_it():
    label = metrics.BoundedLabel(limit=2)
    assert [label(code) for code in ("a_code", "b_code", "c_code", "a_code")] == ["a_code", "b_code", "other", "a_code"]


def test_a_handoff_is_the_time_since_the_envelope_and_never_negative():
    registry = metrics.registry()
    consumer = metrics.ConsumerMetrics(registry, "song")
    consumer.handed_off("lyric.completed", dt.datetime.now(dt.UTC) - dt.timedelta(seconds=2))
    consumer.handed_off("lyric.completed", dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5))  # a clock ahead
    labels = {"service": "song", "event_type": "lyric.completed"}
    assert registry.get_sample_value("castad_handoff_seconds_count", labels) == 2
    assert 2.0 <= (registry.get_sample_value("castad_handoff_seconds_sum", labels) or 0) < 3.0
    assert registry.get_sample_value("castad_handoff_seconds_bucket", {**labels, "le": "0.001"}) == 1


class Reading:
    def __init__(self, part: str, value: float | None, ttl_s: float = 0.0) -> None:
        self.part, self.value, self.ttl_s, self.reads = part, value, ttl_s, 0

    def families(self) -> list[Metric]:
        return [GaugeMetricFamily("castad_test_depth", "a gauge of a test", labels=["part"])]

    def read(self) -> list[Metric]:
        self.reads += 1
        if self.value is None:
            raise ConnectionRefusedError("nothing listens there")
        [family] = self.families()
        assert isinstance(family, GaugeMetricFamily)
        family.add_metric([self.part], self.value)
        return [family]


def test_a_reading_that_fails_costs_only_its_own_gauges_and_a_kept_one_is_not_read_again():
    kept, broken = Reading("kept", 3.0, ttl_s=60.0), Reading("broken", None)
    registry = metrics.registry()
    scrape.register(registry, [kept, broken])

    for _ in range(2):
        samples = {(s.name, s.labels["part"]): s.value for family in registry.collect() for s in family.samples}
        assert samples == {
            ("castad_test_depth", "kept"): 3.0,
            ("castad_scrape_success", "kept"): 1.0,
            ("castad_scrape_success", "broken"): 0.0,
        }
    assert (kept.reads, broken.reads) == (1, 2)


def test_the_probe_server_serves_metrics_as_prometheus_text_or_openmetrics():
    port = stack.free_port()
    registry = metrics.registry()
    metrics.ConsumerMetrics(registry, "video").dead_lettered(metrics.UNDECODABLE)
    probes = health.ProbeServer(port, liveness={}, readiness={}, registry=registry)
    probes.start()
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        openmetrics = httpx.get(
            f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=5
        )
        missing = httpx.get(f"http://127.0.0.1:{port}/nothing", timeout=5)
    finally:
        probes.stop()
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'castad_consumer_dead_letters_total{reason="undecodable",service="video"} 1.0' in text.text
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")
    assert missing.status_code == 404 and "/metrics" in missing.json()["detail"]


def test_the_gateway_counts_requests_by_route_template_and_serves_metrics_without_a_key(tmp_path):
    config = settings.ApiSettings()
    gateway = deps.Gateway(
        config=config,
        engine=sa.create_engine(config.database_url),  # never connected: no request here reaches the database
        notifications=notifications.PipelineNotifications(config.database_url),
        store=volume.VolumeStore(tmp_path),
    )

    async def requests() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app.create_app(gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            paths = ["/healthz", *["/v1/pipelines/6f1c1a52-2a41-4e0c-9d0e-5b9a3f6a1d20"] * 2, "/v1/no/such/0f3c"]
            return [await client.get(path) for path in [*paths, "/metrics"]]

    *answers, page = asyncio.run(requests())

    assert [answer.status_code for answer in answers] == [200, 401, 401, 404]
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    counted = [line for line in page.text.splitlines() if line.startswith("castad_http_requests_total{")]
    assert sorted(counted) == [
        'castad_http_requests_total{method="GET",route="/healthz",status_class="2xx"} 1.0',
        'castad_http_requests_total{method="GET",route="/v1/pipelines/{pipeline_id}",status_class="4xx"} 2.0',
        'castad_http_requests_total{method="GET",route="unmatched",status_class="4xx"} 1.0',
    ]
