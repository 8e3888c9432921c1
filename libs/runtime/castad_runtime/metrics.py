"""Prometheus metrics of a process: a registry of its own, label values kept few, the text a scrape reads.

A composition root makes one registry (`registry()`, never the client's global one) and hands
it to the parts it wires, which make their instruments on it (`ConsumerMetrics`,
`StageMetrics`, ...). So nothing is made at import, and two services built in one process (as
tests do) neither collide nor share figures. A part made without one gets a registry of its own.

Counters and histograms live in memory: recording one costs no database round trip. Gauges that
need the database or the broker are read when Prometheus scrapes (castad_runtime.scrape).

Label values are bounded: never a pipeline, job or worker id, never free text. An error code is a
label value only if it looks like one (`ERROR_CODE`) and is one of the codes this runtime gives
itself or among the first `MAX_CODES` other distinct ones of the process; any other is `other`.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import exposition as exposition_

ERROR_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_CODES = 50  # distinct error codes a process gives as label values, besides the known ones
OTHER = "other"
NONE = "none"  # the error code of an attempt that succeeded

# Seconds, from a millisecond handoff to a minute-long wait for a slot.
HANDOFF_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Seconds, from an instant provider to a render that takes most of the attempt timeout.
ATTEMPT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)

# Why a consumer dead-lettered a message (castad_runtime.consumer).
UNDECODABLE = "undecodable"  # not an envelope or a message of this queue's actors
UNKNOWN_TYPE = "unknown_type"  # no handler here takes its type, or its type is unknown
WRONG_SOURCE = "wrong_source"  # it says it comes from another service than the producer of its type
INVALID_PAYLOAD = "invalid_payload"  # its payload does not fit its type
HANDLER_FAILED = "handler_failed"  # its handler failed every try
HELD_TOO_LONG = "held_too_long"  # a newer version, or an operator request out of order, for too long


def registry() -> CollectorRegistry:
    """A registry for one process (or one service built in a test)."""
    return CollectorRegistry(auto_describe=True)


def exposition(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The registry's metrics in the format the scraper asks for, and that format's content type.

    The format is the one the Accept header asks for: Prometheus text by default, OpenMetrics when asked.
    """
    encode, content_type = exposition_.choose_encoder(accept or "")
    return encode(registry), content_type


class BoundedLabel:
    """The values one label may take.

    Those matching `pattern`, `known` ones always, and at most `limit` distinct others per process; anything else
    is `other`.
    """

    def __init__(
        self, pattern: re.Pattern[str] = ERROR_CODE, limit: int = MAX_CODES, known: Iterable[str] = ()
    ) -> None:
        self.pattern = pattern
        self.limit = limit
        self.known = frozenset(known)
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        if value is None:
            return NONE
        if value in self.known:
            return value
        if not self.pattern.fullmatch(value):
            return OTHER
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return OTHER


class ConsumerMetrics:
    """What a service's event consumer counts: handoffs, dead letters, duplicates its inbox saw."""

    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        self.registry = registry
        self.service = service
        self.handoff = Histogram(
            "castad_handoff_seconds",
            "From an event's outbox commit (its envelope's time) to its handler here, by event type",
            ["service", "event_type"],
            buckets=HANDOFF_BUCKETS,
            registry=registry,
        )
        self.dead_letters = Counter(
            "castad_consumer_dead_letters_total",
            "Messages this consumer sent to the dead-letter queue, by why",
            ["service", "reason"],
            registry=registry,
        )
        self.duplicates = Counter(
            "castad_inbox_duplicates_total",
            "Events this service had handled already (a redelivery or a copy), by event type",
            ["service", "event_type"],
            registry=registry,
        )

    def handed_off(self, event_type: str, sent_at: dt.datetime) -> None:
        """An event reached its handler (its type is one this service handles: a bounded label)."""
        elapsed = (dt.datetime.now(dt.UTC) - sent_at).total_seconds()
        self.handoff.labels(self.service, event_type).observe(max(elapsed, 0.0))

    def dead_lettered(self, reason: str) -> None:
        self.dead_letters.labels(self.service, reason).inc()

    def duplicate(self, event_type: str) -> None:
        self.duplicates.labels(self.service, event_type).inc()


class RetentionMetrics:
    """What a service's retention deleted (castad_runtime.retention), by what: a table's rows, a stage's files."""

    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        self.service = service
        self.deleted = Counter(
            "castad_retention_deleted_total",
            "What retention deleted, by what (its steps: rows of a table, files), counted batch by batch",
            ["service", "what"],
            registry=registry,
        )
        self.finished = Gauge(
            "castad_retention_last_round_timestamp_seconds",
            "When this process's retention last finished a round of every step (its start, before the first)",
            ["service"],
            registry=registry,
        )
        self.finished.labels(service).set_to_current_time()

    def removed(self, what: str, count: int) -> None:
        self.deleted.labels(self.service, what).inc(count)

    def round_finished(self) -> None:
        self.finished.labels(self.service).set_to_current_time()


class StageMetrics:
    """What a stage's runner counts.

    Attempts by outcome and error code, their durations, quota waits, the provider's "too many" answers, and the
    submits that went to it or were held back.
    """

    def __init__(self, registry: CollectorRegistry, stage: str, known_codes: Iterable[str] = ()) -> None:
        self.registry = registry
        self.stage = stage
        self.codes = BoundedLabel(known=known_codes)
        self.attempts = Counter(
            "castad_attempts_total",
            "Attempts that ended, by stage, outcome (as the attempts table records it) and error code",
            ["stage", "outcome", "error_code"],
            registry=registry,
        )
        # Without the error code: every code would multiply the histogram's buckets.
        self.durations = Histogram(
            "castad_attempt_duration_seconds",
            "From an attempt's start to its recorded outcome, by stage and outcome",
            ["stage", "outcome"],
            buckets=ATTEMPT_BUCKETS,
            registry=registry,
        )
        self.quota_waits = Counter(
            "castad_quota_waits_total",
            "Claims of due work the provider's quota held back: no token left, a Retry-After running, or as"
            " many jobs at the provider as it allows",
            ["stage", "provider", "reason"],
            registry=registry,
        )
        self.throttled = Counter(
            "castad_provider_throttled_total",
            'Answers "too many" (HTTP 429) from the provider',
            ["stage", "provider"],
            registry=registry,
        )
        self.submissions = Counter(
            "castad_provider_submissions_total",
            "Requests that start work at the provider, by whether they went (sent) or were held back because"
            " the attempt no longer knew it held its job (fenced)",
            ["stage", "provider", "outcome"],
            registry=registry,
        )

        self.probes = Counter(
            "castad_probes_total",
            "Polls of work waiting at the provider made in batches, by what they found: not had yet (later) or done,"
            " failed or past its give-up time (ready: a claim takes the job)",
            ["stage", "outcome"],
            registry=registry,
        )

    def probed(self, later: int, ready: int) -> None:
        """A batch of polls was recorded."""
        self.probes.labels(self.stage, "later").inc(later)
        self.probes.labels(self.stage, "ready").inc(ready)

    def attempt_ended(self, outcome: str, error_code: str | None, duration_s: float | None = None) -> None:
        """An attempt's outcome committed; `duration_s` when this process ran it."""
        self.attempts.labels(self.stage, outcome, self.codes(error_code)).inc()
        if duration_s is not None:
            self.durations.labels(self.stage, outcome).observe(duration_s)

    def quota_wait(self, provider: str, reason: str) -> None:
        self.quota_waits.labels(self.stage, provider, reason).inc()

    def provider_throttled(self, provider: str) -> None:
        self.throttled.labels(self.stage, provider).inc()

    def provider_submission(self, provider: str, outcome: str) -> None:
        """A submit to the provider went (`sent`) or was held back by the fence (`fenced`)."""
        self.submissions.labels(self.stage, provider, outcome).inc()
