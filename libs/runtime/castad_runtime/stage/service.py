"""Composition root shared by the stage services (lyric, song, video)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Literal

from castad_contracts import envelope as envelope_
from castad_contracts import events, topology
from pydantic import Field

from castad_runtime import db, inbox, messaging, process, settings
from castad_runtime.stage import faults, machine, repository, runner, scheduler


class StageSettings(settings.CommonSettings):
    """Settings of a stage service; each service sets its own prefix (CASTAD_LYRIC_, ...)."""

    database_url: str = Field(
        pattern=settings.POSTGRES_URL, description="the stage's own database (<stage>: lyric, song or video)"
    )
    max_attempts: int = Field(default=5, ge=1, le=100, description="attempts per job, first one included")
    backoff_base_s: float = Field(default=1.0, ge=0, description="delay after the first failed attempt")
    backoff_max_s: float = Field(default=60.0, ge=0, description="longest delay between attempts")
    backoff_jitter: float = Field(default=0.5, ge=0, le=1, description="fraction of the delay taken off at random")
    lease_s: float = Field(default=30.0, gt=0, description="lease of a running attempt, renewed every third")
    attempt_timeout_s: float = Field(default=600.0, gt=0, description="an attempt taking longer fails (retryable)")
    concurrency: int = Field(default=2, ge=1, le=64, description="attempts running at once in this process")
    consumer_threads: int = Field(default=2, ge=1, le=64, description="Dramatiq threads handling events")
    poll_s: float = Field(default=0.5, gt=0, le=60, description="how often due retries and lost leases are checked")
    provider: Literal["local", "instant"] = Field(
        default="local",
        description="`local` makes the real artifact offline; `instant` writes a tiny valid one at once (benchmarks)",
    )
    fault_failure_rate: float = Field(default=0.0, ge=0, le=1, description="share of provider calls that fail")
    fault_retryable: bool = Field(default=True, description="whether injected failures are retryable")
    fault_latency_s: float = Field(default=0.0, ge=0, description="added delay before every provider call")
    fault_hang_rate: float = Field(default=0.0, ge=0, le=1, description="share of provider calls that never return")

    def retry_policy(self) -> machine.RetryPolicy:
        return machine.RetryPolicy(
            max_attempts=self.max_attempts,
            base_delay_s=self.backoff_base_s,
            max_delay_s=max(self.backoff_max_s, self.backoff_base_s),
            jitter=self.backoff_jitter,
        )

    def faults(self) -> faults.Faults:
        return faults.Faults(
            failure_rate=self.fault_failure_rate,
            retryable=self.fault_retryable,
            latency_s=self.fault_latency_s,
            hang_rate=self.fault_hang_rate,
        )


@dataclasses.dataclass(frozen=True)
class StageDefinition:
    stage: events.Stage
    trigger: str
    completed_model: type[events.StageCompleted]
    make_work: Callable[[StageSettings], runner.Work]


def run(definition: StageDefinition, config: StageSettings) -> None:
    service = definition.stage.value
    process.start_observability(service, config.log_level)
    topo = topology.Topology(config.namespace)
    engine = db.make_engine(config.database_url, pool_size=config.concurrency + config.consumer_threads + 2)
    injector = faults.FaultInjector(config.faults(), random.Random())
    work = definition.make_work(config)

    def faulty_work(job: repository.Job) -> runner.Output:
        return injector.call(lambda: work(job))

    limits = runner.Limits(config.retry_policy(), config.lease_s, config.attempt_timeout_s)
    stage_runner = runner.StageRunner(
        definition.stage, engine, faulty_work, definition.completed_model, limits, process.worker_id(service)
    )
    jobs = scheduler.JobScheduler(stage_runner, config.concurrency, config.poll_s)

    def on_trigger(env: envelope_.Envelope, payload: events.Payload) -> None:
        with db.transaction(engine) as conn:
            if inbox.first_delivery(conn, env):
                stage_runner.accept(conn, payload)
        jobs.wake()

    messaging.declare_topology(config.amqp_url, topo)
    broker = messaging.make_broker(config.amqp_url)
    messaging.EventConsumer(broker, service, topo, {definition.trigger: on_trigger})
    # Parts stop in reverse order: the scheduler first, so that a stopping service claims no new
    # attempt while it waits for its running ones; events still arriving only become job rows.
    process.run_until_signalled(
        service, [process.ConsumerWorker(broker, config.consumer_threads), jobs], on_stop=engine.dispose
    )
