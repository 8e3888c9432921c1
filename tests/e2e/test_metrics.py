"""Every service's /metrics while a pipeline runs through the real processes.

The figures of what happened move by what one pipeline does (pipelines created, relay published, each stage's attempts
succeeded, handoffs), and the scrape-time gauges are read (the scrapes of databases and broker succeed).
"""

from __future__ import annotations

import httpx
import pytest
from castad_contracts import events, topology
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value of a /metrics page."""
    answer = httpx.get(url, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain"), answer.headers["content-type"]
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`."""
    return sum(v for (n, got), v in samples.items() if n == name and set(labels.items()) <= set(got))


def test_a_pipeline_moves_the_metrics_of_every_service(shared):
    running = shared
    urls = running.metrics_urls()
    assert set(urls) == set(topology.SERVICES)
    running.wait_until("every worker serves /metrics", lambda: all(_serves(url) for url in urls.values()))
    before = {service: scrape(url) for service, url in urls.items()}

    def moved(of: str, name: str, **labels: str) -> float:
        """How much a figure of service `of` moved since `before` (the shared stack's earlier tests moved it too)."""
        return value(after[of], name, **labels) - value(before[of], name, **labels)

    pipeline_id = running.submit()
    assert running.wait_terminal([pipeline_id])[pipeline_id].status == "SUCCEEDED"
    # The gateway projects the last stage's events after the pipeline shows it done; wait for every one.
    handed_off = value(before["api"], "castad_handoff_seconds_count", event_type="video.completed") + 1
    running.wait_until(
        "the gateway's handoffs of the video stage's facts",
        lambda: value(scrape(urls["api"]), "castad_handoff_seconds_count", event_type="video.completed") == handed_off,
    )
    after = {service: scrape(url) for service, url in urls.items()}

    api = after["api"]
    assert moved("api", "castad_pipelines_created_total") == 1
    assert moved("api", "castad_http_requests_total", method="POST", route="/v1/pipelines", status_class="2xx") == 1
    assert moved("api", "castad_projection_events_total", event_type="lyric.completed", outcome="applied") == 1
    assert value(api, "castad_sse_streams_open") == 0
    assert value(api, "castad_dead_letters", status="dead") == 0
    # Each stage's facts (started, completed) reached the gateway.
    assert moved("api", "castad_handoff_seconds_count", service="api") >= 6

    relay = after["relay"]
    # pipeline.requested, then started and completed of each stage: 7 rows from 4 outboxes.
    assert moved("relay", "castad_relay_published_total") == 7
    assert moved("relay", "castad_relay_published_total", source="api") == 1
    assert moved("relay", "castad_relay_published_total", source="video") == 2
    assert moved("relay", "castad_relay_confirm_seconds_count") >= 7
    for source in topology.WITH_DATABASE:
        assert value(relay, "castad_scrape_success", part=f"outbox_{source}") == 1
        assert value(relay, "castad_outbox_backlog", source=source) == 0

    for stage, trigger in events.TRIGGERS.items():
        samples = after[stage]
        assert moved(stage, "castad_attempts_total", stage=stage, outcome="succeeded", error_code="none") == 1
        assert moved(stage, "castad_attempt_duration_seconds_count", stage=stage, outcome="succeeded") == 1
        assert moved(stage, "castad_handoff_seconds_count", service=stage, event_type=trigger) == 1
        assert value(samples, "castad_jobs", stage=stage, status="RUNNING") == 0
        assert value(samples, "castad_scrape_success", part="jobs") == 1
        assert value(samples, "castad_scrape_success", part="rabbitmq") == 1
        queue = running.installation.topology.queue(stage)
        assert ("castad_queue_consumers", (("queue", queue),)) in samples, sorted(samples)[:5]


def _serves(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
