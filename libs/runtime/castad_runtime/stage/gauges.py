"""A stage's gauges read from its own jobs table when Prometheus scrapes (see castad_runtime.scrape)."""

from __future__ import annotations

import sqlalchemy as sa
from castad_contracts import events
from prometheus_client.core import GaugeMetricFamily, Metric

from castad_runtime.stage.repository import claiming


class Jobs:
    """Jobs not ended, by status; those due and not claimed; those whose lease ran out, not yet recovered.

    Of those due, also the ones whose input only a newer release than this replica's reads."""

    part = "jobs"
    ttl_s = 0.0

    def __init__(self, engine: sa.Engine, stage: str) -> None:
        self.engine = engine
        self.stage = stage
        self.reads = events.REGISTRY.current_version(events.TRIGGERS[events.Stage(stage)])

    def families(self) -> list[Metric]:
        return list(self._families())

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "castad_jobs", "Jobs of a stage that have not ended, by status", labels=["stage", "status"]
            ),
            GaugeMetricFamily(
                "castad_jobs_due",
                "Jobs of a stage due now and not claimed: waiting for a free slot or the provider's quota",
                labels=["stage"],
            ),
            GaugeMetricFamily(
                "castad_jobs_for_newer_release",
                "Jobs of a stage due now whose input a newer release than this replica's stored: they wait, untouched,"
                " for a replica of that release",
                labels=["stage"],
            ),
            GaugeMetricFamily(
                "castad_jobs_lease_expired",
                "RUNNING jobs of a stage whose lease ran out (their worker died) and that no one recovered yet",
                labels=["stage"],
            ),
        )

    def read(self) -> list[Metric]:
        with self.engine.connect() as conn:
            counts = claiming.counts(conn, self.reads)
        by_status, due, for_newer, expired = self._families()
        for status, jobs in counts.by_status.items():
            by_status.add_metric([self.stage, status.value], jobs)
        due.add_metric([self.stage], counts.due)
        for_newer.add_metric([self.stage], counts.for_newer)
        expired.add_metric([self.stage], counts.lease_expired)
        return [by_status, due, for_newer, expired]
