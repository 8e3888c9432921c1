"""Gauges read from a database or the broker when Prometheus scrapes, never on a hot path.

A `Reading` says what it reads (its families, empty) and reads them (`read`); `Gauges` is the one
collector of a process that runs its readings at scrape time, each at most once per its `ttl_s`
(a broker reading is kept a few seconds, so that scrapes never hammer it), merges the families of
readings that share a name, and says per reading whether it worked (`castad_scrape_success`). A
reading that fails (its database or the broker is out) costs the scrape only its own gauges: it is
logged, and the scrape goes on, so that the process's counters are still served.

Every reading is bounded in time (`TIMEOUT_S` to connect, to run a statement, to talk to the broker).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import sqlalchemy as sa
from dramatiq.common import dq_name
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from castad_runtime import amqp, db, redact

log = logging.getLogger(__name__)
TIMEOUT_S = 2.0
QUEUE_TTL_S = 5.0  # a broker reading is kept this long


class Reading(Protocol):
    part: str  # what it reads: the `part` label of castad_scrape_success (a fixed name)
    ttl_s: float  # a reading is kept this long (0: read at every scrape)

    def families(self) -> list[Metric]:
        """The families `read` yields, without samples."""
        ...

    def read(self) -> list[Metric]:
        """The families with their samples now; raises if the source cannot be read."""
        ...


class Gauges(Collector):
    """The scrape-time readings of a process, as one collector (see the module docstring)."""

    def __init__(self, readings: Sequence[Reading]) -> None:
        self.readings = list(readings)
        self._lock = threading.Lock()  # one scrape reads at a time; a second one gets what it read
        self._kept: dict[str, tuple[float, list[Metric], bool]] = {}

    def describe(self) -> Iterator[Metric]:
        """Each reading's families as it makes them (the registry only takes their names from here)."""
        return iter([*(family for reading in self.readings for family in reading.families()), _success()])

    def collect(self) -> Iterator[Metric]:
        success = _success()
        read: list[Metric] = []
        with self._lock:
            for reading in self.readings:
                families, ok = self._read(reading)
                read += families
                success.add_metric([reading.part], 1.0 if ok else 0.0)
        return iter(_merged([*read, success]))

    def _read(self, reading: Reading) -> tuple[list[Metric], bool]:
        kept = self._kept.get(reading.part)
        if kept is not None and time.monotonic() - kept[0] < reading.ttl_s:
            return kept[1], kept[2]
        try:
            families, ok = reading.read(), True
        except Exception as error:  # the scrape goes on without this reading's gauges
            log.warning("metrics: cannot read %s: %s", reading.part, redact.describe(error))
            families, ok = reading.families(), False
        self._kept[reading.part] = (time.monotonic(), families, ok)
        return families, ok


def register(registry: CollectorRegistry, readings: Sequence[Reading]) -> None:
    registry.register(Gauges(readings))


def _success() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "castad_scrape_success", "Whether the last scrape-time reading of a part worked (1) or not (0)", labels=["part"]
    )


def _merged(families: list[Metric]) -> list[Metric]:
    """One family per name: readings of several sources (the relay's databases) share their families."""
    merged: dict[str, Metric] = {}
    for family in families:
        if family.name in merged:
            merged[family.name].samples.extend(family.samples)
        else:
            copy = Metric(family.name, family.documentation, family.type, family.unit)
            copy.samples = list(family.samples)
            merged[family.name] = copy
    return list(merged.values())


def engine(url: str) -> sa.Engine:
    """An engine for scrape-time reads.

    One connection, and no wait longer than TIMEOUT_S for it, its connect or a statement (a scrape must not hang on
    a database that is out).
    """
    timeout_ms = int(TIMEOUT_S * 1000)
    return sa.create_engine(
        url,
        pool_size=1,
        max_overflow=0,
        pool_timeout=TIMEOUT_S,
        pool_pre_ping=True,
        connect_args={
            **db.connect_args(url),
            "connect_timeout": max(int(TIMEOUT_S), 1),
            "options": f"-c statement_timeout={timeout_ms}",
        },
    )


class QueueDepth:
    """Messages ready and consumers of some queues, by a passive declare with the service's own user."""

    part = "rabbitmq"
    ttl_s = QUEUE_TTL_S

    def __init__(self, amqp_url: str, queues: Sequence[str]) -> None:
        self.amqp_url = amqp_url
        self.queues = list(queues)

    @classmethod
    def of_service(cls, amqp_url: str, queue: str, *others: str) -> QueueDepth:
        """A service's own queue and its delay queue (Dramatiq's, where retries and held events wait), and `others`."""
        return cls(amqp_url, [queue, dq_name(queue), *others])

    def families(self) -> list[Metric]:
        return list(self._families())

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("castad_queue_messages", "Messages ready in a queue (not delivered)", labels=["queue"]),
            GaugeMetricFamily("castad_queue_consumers", "Consumers of a queue", labels=["queue"]),
        )

    def read(self) -> list[Metric]:
        messages, consumers = self._families()
        connection = amqp.blocking_connection(self.amqp_url, timeout_s=TIMEOUT_S)
        try:
            channel = connection.channel()
            for queue in self.queues:
                declared = channel.queue_declare(queue, passive=True).method
                messages.add_metric([queue], declared.message_count)
                consumers.add_metric([queue], declared.consumer_count)
        finally:
            if connection.is_open:
                connection.close()
        return [messages, consumers]
