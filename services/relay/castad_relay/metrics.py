"""The relay's metrics.

What it publishes, how fast the broker confirms, what fails, and (read from every outbox at scrape time) what waits
to be published and what is parked.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from castad_runtime import db, metrics, scrape
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from castad_relay import statements

# Why a row was not published (castad_relay.publisher's answers).
REFUSED = "refused"  # the broker will not take it for its own sake: unroutable, too large
FORBIDDEN = "forbidden"  # its outbox's service may not publish it (castad_relay.ownership): parked at once
CHANNEL_CLOSED = "channel_closed"  # its channel closed while it was in flight (tried again alone)
BROKER_UNAVAILABLE = "broker_unavailable"  # lost to trouble with the broker connection (waits, uncharged)
QUEUE_MISSING = "queue_missing"  # a queue that must take it does not exist yet (waits, uncharged)
UNREAD = "unread"  # no replica of a service that takes it reads its version yet (waits, uncharged)
NACKED = "nacked"  # the broker refused it: a queue that takes it is full, or without a majority (waits, uncharged)
PUSHED_BACK = "pushed_back"  # held unsent while a queue that takes it refuses publishes (waits, uncharged)

CONFIRM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def instruments(sources: Mapping[str, str]) -> RelayMetrics:
    """The relay's metrics on a registry of their own, with each source database's outbox.

    Sources map service to URL; each outbox is read at scrape time. Nothing connects until a scrape reads them.
    """
    registry = metrics.registry()
    scrape.register(registry, [Outbox(url, service) for service, url in sources.items()])
    return RelayMetrics(registry)


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.published = Counter(
            "castad_relay_published_total",
            "Outbox rows published and confirmed by the broker, by source database",
            ["source"],
            registry=registry,
        )
        self.confirms = Histogram(
            "castad_relay_confirm_seconds",
            "From a row's publish to the broker's confirm of it",
            buckets=CONFIRM_BUCKETS,
            registry=registry,
        )
        self.failures = Counter(
            "castad_relay_publish_failures_total",
            "Rows a publish round did not get published, by source database and why",
            ["source", "reason"],
            registry=registry,
        )
        self.batches = Histogram(
            "castad_relay_batch_rows",
            "Rows taken from an outbox for one publish round, by source database",
            ["source"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )


class Outbox:
    """What waits in one source database's outbox, read when Prometheus scrapes.

    A connection each time, TIMEOUT_S at most to connect and to run the statement.
    """

    ttl_s = 0.0

    def __init__(self, url: str, source: str) -> None:
        self.url = url
        self.source = source
        self.part = f"outbox_{source}"

    def families(self) -> list[Metric]:
        return list(self._families())

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "castad_outbox_backlog",
                "Outbox rows not yet published (parked ones aside), by source database",
                labels=["source"],
            ),
            GaugeMetricFamily(
                "castad_outbox_oldest_unpublished_age_seconds",
                "Age of the oldest outbox row not yet published (parked ones aside; 0: none), by source database",
                labels=["source"],
            ),
            GaugeMetricFamily(
                "castad_outbox_parked",
                "Outbox rows the relay parked after the broker refused them, by source database",
                labels=["source"],
            ),
        )

    def read(self) -> list[Metric]:
        timeout_ms = int(scrape.TIMEOUT_S * 1000)
        parameters = {
            **db.connect_kwargs(self.url),
            "connect_timeout": int(scrape.TIMEOUT_S),
            "options": f"-c statement_timeout={timeout_ms}",
        }
        with psycopg.connect(**parameters) as conn:
            conn.execute(statements.PINNED)
            row = conn.execute(statements.BACKLOG).fetchone()
        assert row is not None
        backlog, oldest, parked = self._families()
        backlog.add_metric([self.source], row[0])
        oldest.add_metric([self.source], float(row[1]))
        parked.add_metric([self.source], row[2])
        return [backlog, oldest, parked]
