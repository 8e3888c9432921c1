"""Each metric moves when its event happens, on a real PostgreSQL and RabbitMQ.

Attempts and their durations once their outcome commits, quota waits and 429s, inbox duplicates, the projection's
outcomes, what the relay publishes and what the broker refuses; and the gauges a scrape reads from the databases
and the broker (jobs by status, due, with an expired lease; outbox backlog, oldest row, parked rows; queue depth;
recorded dead letters).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping

import pytest
import sqlalchemy as sa
from castad_api import creation, dead_letter_rows, dead_letters, projection
from castad_api import metrics as api_metrics
from castad_contracts import api, codes, envelope, events
from castad_relay import metrics as relay_metrics
from castad_runtime import db, metrics, scrape, tables
from castad_runtime.stage import cancellation, errors, gauges, handlers, quota, remote, repository
from prometheus_client import CollectorRegistry

from tests.integration.helpers import (
    all_published,
    hear_only_started,
    lyric_started,
    requested_envelope,
    stage_runner,
    succeed,
    write_events,
    write_unroutable,
)
from tests.integration.test_remote_jobs import Provider, fresh_provider, remote_runner, turn
from tests.integration.test_stage_runner import Script, add_job
from tests.support import waits
from tests.support.installation import Installation

pytestmark = pytest.mark.integration
STAGE = {"stage": "lyric"}


@pytest.fixture
def engine(engines: Mapping[str, sa.Engine]) -> sa.Engine:
    return engines["lyric"]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def scraped(*readings: scrape.Reading) -> CollectorRegistry:
    registry = metrics.registry()
    scrape.register(registry, readings)
    return registry


def test_attempt_outcomes_are_counted_with_their_error_code_and_duration_once_recorded(engine):
    script = Script(errors.ProviderError("provider_timeout", "no answer"), None)
    stage = stage_runner(engine, script)
    registry = stage.metrics.registry  # the runner made its own
    add_job(stage)

    stage.execute(stage.claim_next())
    failed = {**STAGE, "outcome": "failed_retryable", "error_code": "provider_timeout"}
    assert sample(registry, "castad_attempts_total", **failed) == 1
    assert sample(registry, "castad_attempt_duration_seconds_count", stage="lyric", outcome="failed_retryable") == 1

    stage.execute(waits.until(stage.claim_next, timeout_s=5, what="the retry due"))
    succeeded = {**STAGE, "outcome": "succeeded", "error_code": "none"}
    assert sample(registry, "castad_attempts_total", **succeeded) == 1
    assert sample(registry, "castad_attempt_duration_seconds_count", stage="lyric", outcome="succeeded") == 1
    assert sample(registry, "castad_attempt_duration_seconds_sum", stage="lyric", outcome="succeeded") > 0


def test_a_lost_lease_and_a_cancel_end_their_attempts_in_the_counts(engine):
    dead = stage_runner(engine, succeed, worker="dead", lease_s=0.2)
    alive = stage_runner(engine, succeed, worker="alive")
    registry = alive.metrics.registry
    add_job(dead)
    assert dead.claim_next() is not None  # its worker dies holding it

    waits.until(lambda: alive.recover_expired_leases() == 1, timeout_s=5, what="the lease recovered")
    lost = {**STAGE, "outcome": "interrupted", "error_code": "lease_expired"}
    assert sample(registry, "castad_attempts_total", **lost) == 1
    # Its duration is not this process's to know.
    assert sample(registry, "castad_attempt_duration_seconds_count", stage="lyric", outcome="interrupted") == 0

    claim = alive.claim_next()  # the job handed back is due again at once
    assert claim is not None
    cancel = events.PipelineCancelRequested(pipeline_id=claim.job.pipeline_id, operation=1, reason="wrong brief")
    with db.transaction(engine) as conn:
        alive.apply_cancel(conn, cancel)
        assert sample(registry, "castad_attempts_total", **STAGE, outcome="canceled", error_code="canceled") == 0
    assert sample(registry, "castad_attempts_total", **STAGE, outcome="canceled", error_code="canceled") == 1


class Limited(Provider):
    """A provider that answers every submit with "too many"."""

    def submit(
        self, job: repository.Job, callback_url: str | None, cancel: cancellation.Cancellation
    ) -> remote.Submitted:
        raise errors.ProviderError(codes.ErrorCode.PROVIDER_RATE_LIMITED, "too many", retry_after_s=0.1)


def test_a_due_job_the_quota_holds_back_is_a_wait_and_a_429_is_counted(engine):
    name = fresh_provider(engine, max_rate_per_s=0.01, min_rate_per_s=0.01, burst=1.0)
    stage = remote_runner(engine, Provider(), remote.PollSchedule(first_s=3600.0, max_s=3600.0))
    stage.provider = name
    registry = stage.metrics.registry
    waits = {"provider": name, "reason": quota.NO_TOKEN}
    assert stage.claim_next() is None and sample(registry, "castad_quota_waits_total", **STAGE, **waits) == 0
    add_job(stage)
    add_job(stage)

    assert turn(stage) is not None  # the only token: its work is submitted
    assert stage.claim_next() is None
    assert sample(registry, "castad_quota_waits_total", **STAGE, **waits) == 1

    capped = fresh_provider(engine, max_in_flight=1)
    stage.provider = capped
    assert stage.claim_next() is None  # one job is at the provider already; the other is due
    in_flight = {"provider": capped, "reason": quota.IN_FLIGHT_CAP}
    assert sample(registry, "castad_quota_waits_total", **STAGE, **in_flight) == 1

    busy = remote_runner(engine, Limited(), remote.PollSchedule(first_s=3600.0, max_s=3600.0))
    busy.provider = fresh_provider(engine)
    busy_registry = busy.metrics.registry
    busy.execute(busy.claim_next())
    assert sample(busy_registry, "castad_provider_throttled_total", **STAGE, provider=busy.provider) == 1
    handed_back = {**STAGE, "outcome": "interrupted", "error_code": codes.ErrorCode.PROVIDER_RATE_LIMITED}
    assert sample(busy_registry, "castad_attempts_total", **handed_back) == 1


def test_a_duplicate_is_counted_by_the_inbox_once_its_transaction_committed(engine):
    registry = metrics.registry()
    measured = metrics.ConsumerMetrics(registry, "lyric")
    woken: list[bool] = []
    stage = handlers.StageHandlers(
        engine, stage_runner(engine, succeed), handlers.WakeOnly(lambda: woken.append(True)), None, measured
    )
    env = requested_envelope()
    payload = env.payload()

    stage.on_trigger(env, payload)
    duplicates = {"service": "lyric", "event_type": events.PIPELINE_REQUESTED}
    assert sample(registry, "castad_inbox_duplicates_total", **duplicates) == 0
    stage.on_trigger(env, payload)
    stage.on_trigger(env, payload)

    assert sample(registry, "castad_inbox_duplicates_total", **duplicates) == 2
    assert woken == [True]


def test_the_projection_counts_what_it_applied_what_was_stale_and_duplicates(engines):
    engine = engines["api"]
    with db.transaction(engine) as conn:
        accepted = creation.create(conn, api.PipelineRequest(customer_name="Cafe", region="Busan"), "t", "k", 3600)
    measured = api_metrics.GatewayMetrics()
    pipeline_id = str(accepted.pipeline_id)
    later, earlier = (envelope.wrap(lyric_started(pipeline_id, n), "lyric.started", "/castad/lyric") for n in (2, 1))
    unknown = envelope.wrap(lyric_started(str(uuid.uuid4()), 1), "lyric.started", "/castad/lyric")

    for env in (later, earlier, later, unknown):
        projection.apply(engine, env, env.payload(), measured)

    registry = measured.registry
    for outcome in (api_metrics.APPLIED, api_metrics.STALE, api_metrics.UNKNOWN_PIPELINE):
        assert sample(registry, "castad_projection_events_total", event_type="lyric.started", outcome=outcome) == 1
    duplicates = {"service": "api", "event_type": "lyric.started"}
    assert sample(registry, "castad_inbox_duplicates_total", **duplicates) == 1


@pytest.fixture
def scrape_engine(installation: Installation) -> Iterator[sa.Engine]:
    """The lyric database as a scrape reads it (castad_runtime.scrape.engine)."""
    made = scrape.engine(installation.database_urls["lyric"])
    yield made
    made.dispose()


def test_the_jobs_gauges_read_each_status_the_due_ones_and_the_expired_leases(engine, scrape_engine):
    stage = stage_runner(engine, succeed, lease_s=0.2)
    registry = scraped(gauges.Jobs(scrape_engine, "lyric"))
    for _ in range(3):
        add_job(stage)
    assert stage.claim_next() is not None  # RUNNING, and its worker dies holding it

    def jobs(status: str) -> float:
        return sample(registry, "castad_jobs", stage="lyric", status=status)

    waits.until(lambda: sample(registry, "castad_jobs_lease_expired", stage="lyric") == 1, timeout_s=5, what="expiry")
    assert (jobs("PENDING"), jobs("RUNNING"), jobs("RETRY_WAIT"), jobs("AWAITING")) == (2, 1, 0, 0)
    assert sample(registry, "castad_jobs_due", stage="lyric") == 2
    assert sample(registry, "castad_scrape_success", part="jobs") == 1

    stage.recover_expired_leases()
    assert sample(registry, "castad_jobs_lease_expired", stage="lyric") == 0
    assert (jobs("RUNNING"), jobs("RETRY_WAIT")) == (0, 1)


def test_the_outbox_gauges_read_the_backlog_its_oldest_row_and_the_parked_rows(installation, engines):
    engine = engines["song"]
    url = installation.database_urls["song"]
    registry = scraped(relay_metrics.Outbox(url, "song"))
    song = {"source": "song"}
    assert sample(registry, "castad_outbox_backlog", **song) == 0
    assert sample(registry, "castad_outbox_oldest_unpublished_age_seconds", **song) == 0

    payloads = [lyric_started(str(uuid.uuid4()), n, events.Stage.SONG) for n in (1, 2, 3)]
    write_events(engine, payloads, "song.started")
    parked = write_unroutable(engine, str(uuid.uuid4()))  # lyric's, in song's outbox: it is never published
    with db.transaction(engine) as conn:
        conn.execute(tables.outbox.update().where(tables.outbox.c.event_id == parked).values(parked_at=sa.func.now()))
    time.sleep(0.3)

    assert sample(registry, "castad_outbox_backlog", **song) == 3
    assert sample(registry, "castad_outbox_parked", **song) == 1
    assert sample(registry, "castad_outbox_oldest_unpublished_age_seconds", **song) >= 0.3
    assert sample(registry, "castad_scrape_success", part="outbox_song") == 1


def test_queue_depth_is_read_by_a_passive_declare_and_kept_a_few_seconds(installation, amqp):
    topology = installation.topology
    queue = topology.queue("lyric")
    registry = scraped(scrape.QueueDepth.of_service(installation.amqp_url, queue, topology.dead_letter_queue))
    for _ in range(2):
        amqp.publish(topology.exchange, events.PIPELINE_REQUESTED, requested_envelope().to_json())

    assert sample(registry, "castad_queue_messages", queue=queue) == 2
    assert sample(registry, "castad_queue_messages", queue=f"{queue}.DQ") == 0
    assert sample(registry, "castad_queue_consumers", queue=queue) == 0
    amqp.publish(topology.exchange, events.PIPELINE_REQUESTED, requested_envelope().to_json())
    assert sample(registry, "castad_queue_messages", queue=queue) == 2, "read again within its few seconds"
    fresh = scraped(scrape.QueueDepth.of_service(installation.amqp_url, queue))
    assert sample(fresh, "castad_queue_messages", queue=queue) == 3

    missing = scraped(scrape.QueueDepth(installation.amqp_url, [f"{queue}.nowhere"]))
    assert sample(missing, "castad_scrape_success", part="rabbitmq") == 0


def test_the_gateways_dead_letters_gauge_counts_them_by_status(engines):
    engine = engines["api"]
    registry = scraped(api_metrics.DeadLetters(engine))
    assert sample(registry, "castad_dead_letters", status="dead") == 0
    with db.transaction(engine) as conn:
        for n in range(2):
            dead_letters.record(conn, dead_letter_rows.describe(f"m-{n}", {"x-castad-reason": "poison"}, b"{}", 1024))

    assert sample(registry, "castad_dead_letters", status="dead") == 2
    assert sample(registry, "castad_dead_letters", status="replayed") == 0


def test_the_relay_counts_what_it_published_its_confirms_its_batches_and_what_was_refused(
    installation, engines, amqp, start_relay, monkeypatch
):
    engine = engines["lyric"]
    registry = metrics.registry()
    hear_only_started(amqp, installation.topology, monkeypatch)
    write_events(engine, [lyric_started(str(uuid.uuid4()), 1) for _ in range(5)], "lyric.started")
    write_unroutable(engine, str(uuid.uuid4()))
    start_relay(metrics=relay_metrics.RelayMetrics(registry), sources={"lyric": installation.database_urls["lyric"]})

    lyric = {"source": "lyric"}
    waits.until(lambda: sample(registry, "castad_relay_published_total", **lyric) == 5, what="5 rows published")
    waits.until(
        lambda: sample(registry, "castad_relay_publish_failures_total", **lyric, reason=relay_metrics.REFUSED) >= 1,
        what="the unroutable row refused",
    )
    assert not all_published(engine)
    assert sample(registry, "castad_relay_confirm_seconds_count") >= 5
    assert sample(registry, "castad_relay_batch_rows_count", **lyric) >= 1
    assert sample(registry, "castad_relay_batch_rows_sum", **lyric) >= 6
