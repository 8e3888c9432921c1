"""Composition root shared by the stage services (lyric, song, video)."""

from __future__ import annotations

import dataclasses
import pathlib
import random
from collections.abc import Callable
from typing import Annotated, Any, Generic, Literal, Self, TypeVar

import sqlalchemy as sa
from castad_contracts import events, topology
from prometheus_client import CollectorRegistry
from pydantic import Field, SecretStr, model_validator

from castad_runtime import (
    announcement,
    artifacts,
    consumer,
    db,
    health,
    links,
    messaging,
    metrics,
    outages,
    process,
    release,
    retention,
    scrape,
    settings,
    wakeups,
)
from castad_runtime.stage import (
    cancellation,
    faults,
    gauges,
    handlers,
    http,
    machine,
    outcomes,
    probes,
    quota,
    remakes,
    remote,
    repository,
    reviews,
    runner,
    scheduler,
)
from castad_runtime.stage import retention as stage_retention
from castad_runtime.stage.repository import polls

OFFLINE_PROVIDERS = frozenset({"local", "instant"})  # every other provider is a network one, with a quota
PROBE_LEASES = 4  # a batch of polls holds its jobs this many attempt leases (its polls wait for slow answers)

# A network provider's settings are named after it (CASTAD_<STAGE>_<PROVIDER>_*): `<provider>_base_url`,
# `_api_key`, `_api_key_file`, `_timeout_s` and `_max_answer_bytes`, of these types where they are alike;
# StageSettings checks them and builds the provider's client from them.
ProviderKeyFile = Annotated[
    pathlib.Path | None,
    Field(description="a file holding the API key, read at every call (a mounted Secret can rotate)"),
]
ProviderTimeout = Annotated[float, Field(gt=0, description="longest wait for one answer")]
ProviderMaxAnswer = Annotated[int, Field(ge=1024, description="a larger answer is refused")]


class StageSettings(settings.StoreSettings):
    """Settings of a stage service; each service sets its own prefix (CASTAD_LYRIC_, ...)."""

    database_url: str = Field(
        pattern=settings.POSTGRES_URL, description="the stage's own database (<stage>: lyric, song or video)"
    )
    outbox_relay_role: settings.OutboxRelayRole = None
    max_attempts: int = Field(default=5, ge=1, le=100, description="attempts per job, first one included")
    backoff_base_s: float = Field(default=1.0, ge=0, description="delay after the first failed attempt")
    backoff_max_s: float = Field(default=60.0, ge=0, description="longest delay between attempts")
    backoff_jitter: float = Field(default=0.5, ge=0, le=1, description="fraction of the delay taken off at random")
    lease_s: float = Field(default=30.0, gt=0, description="lease of a running attempt, renewed every third")
    attempt_timeout_s: float = Field(default=600.0, gt=0, description="an attempt taking longer fails (retryable)")
    concurrency: int = Field(default=2, ge=1, le=64, description="attempts running at once in this process")
    consumer_threads: int = Field(default=2, ge=1, le=64, description="Dramatiq threads handling events")
    poll_s: float = Field(default=0.5, gt=0, le=60, description="how often due retries and lost leases are checked")
    db_idle_in_transaction_s: settings.IdleInTransactionS = 10.0
    db_lock_wait_s: settings.LockWaitS = 5.0
    db_statement_s: settings.StatementS = 60.0
    health_port: settings.HealthPort = None
    stop_grace_s: float = Field(
        default=20.0,
        ge=0,
        description="a stopping service lets running attempts finish this long, then hands them back (not counted)",
    )
    provider: Literal["local", "instant"] = Field(
        default="local",
        description="`local` makes the real artifact offline; `instant` writes a tiny valid one at once (benchmarks)",
    )
    poll_first_s: float = Field(
        default=5.0, gt=0, description="work submitted to a network provider is first polled this long after"
    )
    poll_max_s: float = Field(default=30.0, gt=0, description="longest wait between polls (the wait grows 1.5x)")
    probe_batch: int = Field(
        default=100,
        ge=0,
        le=5000,
        description="work waiting at a network provider is polled in batches of up to this many jobs: one"
        " transaction claims them, one records what the polls found (0: each poll is a claim of its own)",
    )
    probe_threads: int = Field(
        default=64, ge=1, le=256, description="polls of work waiting at a network provider under way at once"
    )
    provider_give_up_s: float = Field(
        default=1800.0, gt=0, description="work a provider has not finished by then fails the attempt (retryable)"
    )
    allow_private: bool = Field(
        default=False,
        description="let calls to the network provider and downloads of its results go to private, loopback and"
        " link-local addresses and over plain http (local fakes and tests only; off: https to public addresses,"
        " checked after DNS and on redirects)",
    )
    download_max_bytes: int = Field(
        default=200_000_000, ge=1024, description="a provider's result larger than this is refused"
    )
    quota_rate_per_s: float = Field(
        default=5.0, gt=0, description="calls per second to a network provider, across every worker of the service"
    )
    quota_min_rate_per_s: float = Field(
        default=0.2, gt=0, description="the lowest the rate falls to when the provider answers 429"
    )
    quota_burst: float = Field(default=5.0, ge=1, description="calls that may go at once after a quiet spell")
    quota_max_in_flight: int | None = Field(
        default=None, ge=1, description="jobs at the network provider at once (none: no cap)"
    )
    fault_failure_rate: float = Field(default=0.0, ge=0, le=1, description="share of provider calls that fail")
    fault_retryable: bool = Field(default=True, description="whether injected failures are retryable")
    fault_latency_s: float = Field(default=0.0, ge=0, description="added delay before every provider call")
    fault_hang_rate: float = Field(
        default=0.0, ge=0, le=1, description="share of provider calls that hang until the attempt is cancelled"
    )
    fault_permanent_rate: float = Field(
        default=0.0, ge=0, le=1, description="share of provider calls that fail non-retryably (besides the above)"
    )
    fault_handler_rate: float = Field(
        default=0.0, ge=0, le=1, description="share of trigger handlings that fail as a handler bug would"
    )
    fault_switch: bool = Field(
        default=False,
        description="read the faults to inject from the stage's own table injected_faults at every provider call"
        " and trigger, so that tests and demos change them while it runs (the CASTAD_<STAGE>_FAULT_* settings"
        " while the table is empty); off in production",
    )

    @model_validator(mode="after")
    def _network_provider_usable(self) -> Self:
        if self.provider not in OFFLINE_PROVIDERS:
            settings.check_key(self, f"{self.provider}_api_key")
            settings.check_provider_url(self, f"{self.provider}_base_url")
        return self

    def provider_client(self, name: str, classify: http.Classify = http.classify) -> http.HttpProvider:
        """Return the client of this stage's network provider, from the settings named after it.

        `name` is how its errors call it ("the music API").
        """

        def setting(part: str) -> Any:
            return getattr(self, f"{self.provider}_{part}")

        key = http.Credential(setting("api_key"), setting("api_key_file"))
        return http.HttpProvider(
            name,
            setting("base_url"),
            setting("timeout_s"),
            setting("max_answer_bytes"),
            headers=key.bearer,
            allow_private=self.allow_private,
            classify=classify,
        )

    def retry_policy(self) -> machine.RetryPolicy:
        return machine.RetryPolicy(
            max_attempts=self.max_attempts,
            base_delay_s=self.backoff_base_s,
            max_delay_s=max(self.backoff_max_s, self.backoff_base_s),
            jitter=self.backoff_jitter,
        )

    def quota_limits(self) -> quota.Limits | None:
        """The provider's quota; None for an offline one."""
        if self.provider in OFFLINE_PROVIDERS:
            return None
        return quota.Limits(
            provider=self.provider,
            max_rate_per_s=self.quota_rate_per_s,
            min_rate_per_s=min(self.quota_min_rate_per_s, self.quota_rate_per_s),
            burst=self.quota_burst,
            max_in_flight=self.quota_max_in_flight,
        )

    def poll_schedule(self) -> remote.PollSchedule:
        return remote.PollSchedule(
            first_s=self.poll_first_s, max_s=max(self.poll_max_s, self.poll_first_s), give_up_s=self.provider_give_up_s
        )

    def faults(self) -> faults.Faults:
        return faults.Faults(
            failure_rate=self.fault_failure_rate,
            retryable=self.fault_retryable,
            latency_s=self.fault_latency_s,
            hang_rate=self.fault_hang_rate,
            permanent_rate=self.fault_permanent_rate,
            handler_rate=self.fault_handler_rate,
        )


class LinkingStageSettings(StageSettings):
    """Settings of a stage whose provider reaches the gateway by links the stage signs (song, video)."""

    gateway_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="the gateway's URL as network providers reach it: they call back to it when their work"
        " moves on (none: they are only polled)",
    )
    link_secret: SecretStr | None = Field(
        default=None,
        min_length=32,
        description="this stage's key for the gateway's links that its network provider uses without an API key"
        " (callbacks; the song a render API fetches), derived from the gateway's CASTAD_API_LINK_SECRET:"
        " `python -m castad_api link-secrets` prints it",
    )

    poll_max_called_back_s: float = Field(
        default=300.0,
        gt=0,
        description="longest wait between polls while the network provider calls back (a gateway URL is set): its"
        " callback makes the poll due at once, and the polls are only a safety net",
    )

    def poll_schedule(self) -> remote.PollSchedule:
        """The polls' schedule: with callbacks, the longest wait is `poll_max_called_back_s` (issue 37)."""
        schedule = super().poll_schedule()
        if self.gateway_url is None:
            return schedule
        return dataclasses.replace(schedule, max_s=max(schedule.max_s, self.poll_max_called_back_s))

    def link_valid_s(self) -> float:
        """How long a link this stage signs is valid: while its provider's work may take, and a margin."""
        return self.provider_give_up_s + links.MARGIN_S

    def callback_url(self, stage: events.Stage) -> remote.CallbackUrl:
        """Where the stage's provider calls back about a job.

        A link of the gateway signed for the job's pipeline, valid while the work may take (None without a gateway
        URL).
        """
        base, secret, valid_s = self.gateway_url, self.link_secret, self.link_valid_s()
        if base is None or secret is None:
            return lambda job: None
        purpose = links.Purpose.CALLBACK
        return lambda job: links.sign(
            base, f"/v1/provider-callbacks/{stage.value}/{job.pipeline_id}", secret, purpose, valid_s
        )

    @model_validator(mode="after")
    def _gateway_links_are_signed(self) -> Self:
        if self.gateway_url is not None and self.link_secret is None:
            raise ValueError(
                f"a gateway URL for network providers needs {settings.env_var(type(self), 'link_secret')} to sign"
                " its links (`python -m castad_api link-secrets` derives it from CASTAD_API_LINK_SECRET)"
            )
        return self


S = TypeVar("S", bound=StageSettings)


@dataclasses.dataclass(frozen=True)
class StageDefinition(Generic[S]):
    stage: events.Stage
    completed_model: type[events.StageCompleted]
    make_work: Callable[[S], runner.Work]
    # A stage that drafts for a review (events.DRAFTED): how it keeps a person's edit (castad_runtime.stage.reviews).
    make_edit: Callable[[S], reviews.Edit] | None = None


def run(definition: StageDefinition[S], config: S) -> None:
    service = definition.stage.value
    process.start_observability(service, config.log_level)
    topo = topology.Topology(config.namespace)
    sessions = db.SessionLimits.of(config)
    engine = db.make_engine(config.database_url, config.concurrency + config.consumer_threads + 3, sessions)
    injector = faults.FaultInjector(
        faults.Switch(engine, config.faults()) if config.fault_switch else config.faults(), random.Random()
    )
    work = definition.make_work(config)

    def faulty_work(
        job: repository.Job, cancel: cancellation.Cancellation
    ) -> outcomes.Output | outcomes.Awaiting | outcomes.Drafted:
        return injector.call(lambda: work(job, cancel), cancel)

    limits = runner.Limits(config.retry_policy(), config.lease_s, config.attempt_timeout_s)
    quota_limits = config.quota_limits()
    if quota_limits is not None:

        def configure() -> None:
            with db.transaction(engine) as conn:
                quota.configure(conn, quota_limits)

        outages.keep_trying(configure, f"{service}: setting the quota of {quota_limits.provider}")
    measured = instruments(service, config, topo)
    prober = None
    if isinstance(work, remote.RemoteWork) and config.probe_batch > 0:
        probe = work.probe

        def faulty_probe(job: polls.Probe, cancel: cancellation.Cancellation) -> remote.Later | None:
            return injector.call(lambda: probe(job, cancel), cancel)

        prober = probes.Prober(
            engine,
            faulty_probe,
            provider=quota_limits.provider if quota_limits else None,
            batch=config.probe_batch,
            threads=config.probe_threads,
            lease_s=config.lease_s * PROBE_LEASES,
            timeout_s=config.attempt_timeout_s,
            metrics=measured.stage,
        )
    # A remake's stage before the one made again copies its output, outside the faults of its provider.
    trigger = events.REGISTRY.model(
        events.TRIGGERS[definition.stage], events.REGISTRY.current_version(events.TRIGGERS[definition.stage])
    )
    reused = remakes.reusing(definition.stage, engine, artifacts.make_store(config), faulty_work, trigger)
    stage_runner = runner.StageRunner(
        definition.stage,
        engine,
        reused,
        definition.completed_model,
        limits,
        process.worker_id(service),
        provider=quota_limits.provider if quota_limits else None,
        metrics=measured.stage,
        probed=prober is not None,
    )
    drafts = None
    if definition.make_edit is not None:
        drafts = reviews.Reviews(stage_runner, definition.make_edit(config))
    jobs = scheduler.JobScheduler(stage_runner, config.concurrency, config.poll_s, config.stop_grace_s, drafts)
    stage_handlers = handlers.StageHandlers(engine, stage_runner, jobs, injector, measured.consumer, drafts)

    messaging.declare_own_when_reachable(config.amqp_url, topo, service)
    broker = messaging.make_broker(config.amqp_url, topo, service)
    event_consumer = consumer.EventConsumer(
        broker,
        service,
        topo,
        stage_handlers.table(events.TRIGGERS[definition.stage]),
        max_retries=config.handler_retries,
        hold_s=config.hold_events_s,
        metrics=measured.consumer,
    )
    announcer = announcement.Announcer(engine, process.worker_id(service), release.of(service), event_consumer.reads())
    worker = process.ConsumerWorker(broker, config.consumer_threads)
    pruner = retention.Pruner.of(
        stage_retention.steps(engine, artifacts.make_store(config), definition.stage, config),
        config,
        measured.retention,
    )
    stuck = db.StuckSessions(engine, config.db_idle_in_transaction_s)
    parts: list[process.Background] = [worker, announcer, jobs, pruner, stuck]
    liveness = {
        "announcement": health.threads_alive(announcer.threads),
        "consumer": health.threads_alive(worker.threads),
        "scheduler": health.threads_alive(jobs.threads),
        "retention": health.threads_alive(pruner.threads),
    }
    if prober is not None:
        parts.append(prober)
        liveness["prober"] = health.threads_alive(prober.threads)
    health_server = None
    if config.health_port is not None:
        health_server = health.ProbeServer(
            config.health_port,
            liveness=liveness,
            readiness={
                "database": health.database(config.database_url),
                "rabbitmq": health.rabbitmq(config.amqp_url),
                **(work.readiness if isinstance(work, remote.RemoteWork) else {}),
            },
            registry=measured.registry,
            release=release.of(service),
        )
    # Parts stop in reverse order: the prober, retention, then the scheduler, so that a stopping service claims no
    # new attempt while it finishes or hands back its running ones; events still arriving only become job rows. Its
    # word on what it reads is given once it consumes.
    process.run_until_signalled(service, parts, on_stop=lambda: _stopped(engine), probes=health_server)


def _stopped(engine: sa.Engine) -> None:
    """Once every part stopped: the last commits' wake-ups sent, the connections closed."""
    wakeups.close_all()
    engine.dispose()


@dataclasses.dataclass(frozen=True)
class Instruments:
    """A stage service's metrics on the registry its /metrics serves."""

    registry: CollectorRegistry
    consumer: metrics.ConsumerMetrics
    stage: metrics.StageMetrics
    retention: metrics.RetentionMetrics


def instruments(service: str, config: StageSettings, topo: topology.Topology) -> Instruments:
    """The stage's metrics.

    What its consumer and runner record, and the gauges a scrape reads (its jobs, its queue and delay queue).
    Nothing connects until a scrape reads them.
    """
    registry = metrics.registry()
    jobs = gauges.Jobs(scrape.engine(config.database_url), service)
    scrape.register(registry, [jobs, scrape.QueueDepth.of_service(config.amqp_url, topo.queue(service))])
    return Instruments(
        registry,
        metrics.ConsumerMetrics(registry, service),
        metrics.StageMetrics(registry, service, runner.OWN_CODES),
        metrics.RetentionMetrics(registry, service),
    )
