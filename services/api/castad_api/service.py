"""Composition root of the gateway.

HTTP API, the consumer that feeds its projection, the recorder of dead letters, the sweeper of overdue pipelines,
the deliverer of notices and retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import signal
from collections.abc import AsyncIterator

import typer
import uvicorn
from castad_contracts import topology
from castad_runtime import (
    announcement,
    artifacts,
    cli,
    consumer,
    db,
    health,
    links,
    messaging,
    process,
    release,
    telemetry,
    wakeups,
)
from castad_runtime import retention as runtime_retention
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

from castad_api import app as app_
from castad_api import (
    dead_letter_recorder,
    deadlines,
    deps,
    metrics,
    notifications,
    projection,
    retention,
    webhook_deliverer,
)
from castad_api import settings as settings_
from castad_api.commands import keys as key_commands
from castad_api.commands import tenants as tenant_commands
from castad_api.commands import webhook_secrets as secret_commands

MIGRATIONS = pathlib.Path(__file__).parent / "migrations"


def build(config: settings_.ApiSettings) -> FastAPI:
    sessions = db.SessionLimits.of(config)
    engine = db.make_engine(config.database_url, 8, sessions)  # HTTP requests and the background loops
    projecting = projection.make_engine(config.database_url, sessions)
    topo = topology.Topology(config.namespace)
    gateway = deps.Gateway(
        config=config,
        engine=engine,
        notifications=notifications.PipelineNotifications(config.database_url, config.sse_sweep_s),
        store=artifacts.make_store(config),
        metrics=metrics.instruments(config.database_url, config.amqp_url, topo, config.prices),
    )
    messaging.declare_own_when_reachable(config.amqp_url, topo, "api")
    broker = messaging.make_broker(config.amqp_url, topo, "api")
    projector = projection.Projector(projecting, gateway.metrics)
    handlers: dict[str, consumer.Handler] = {event_type: projector.apply for event_type in topology.routed("api")}
    event_consumer = consumer.EventConsumer(
        broker,
        "api",
        topo,
        handlers,
        max_retries=config.handler_retries,
        hold_s=config.hold_events_s,
        metrics=gateway.metrics.consumer,
    )
    announcer = announcement.Announcer(engine, process.worker_id("api"), release.of("api"), event_consumer.reads())
    worker = process.ConsumerWorker(broker, config.consumer_threads)
    recorder = dead_letter_recorder.Recorder(
        config.amqp_url, topo.dead_letter_queue, engine, config.dead_letter_body_max_bytes
    )
    sweeper = deadlines.DeadlineSweeper(engine, config.deadline_poll_s)
    deliverer = webhook_deliverer.Deliverer(engine, config)
    pruner = runtime_retention.Pruner.of(
        retention.steps(engine, config, config.retention_policy(), gateway.store, config.upload_limits()),
        config,
        gateway.metrics.retention,
    )
    stuck = db.StuckSessions(engine, config.db_idle_in_transaction_s)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        liveness = {
            "event loop": health.loop_responsive(asyncio.get_running_loop()),
            "consumer": health.threads_alive(worker.threads),
            "announcement": health.threads_alive(announcer.threads),
        }
        probes = app_.probe_server(gateway, liveness)
        if probes is not None:
            probes.start()
        gateway.notifications.start()
        for part in (worker, announcer, recorder, sweeper, deliverer, pruner, stuck):
            part.start()
        process.start_up_done()
        try:
            yield
        finally:
            if probes is not None:
                probes.stopping.set()
            for part in (stuck, pruner, deliverer, sweeper, recorder, announcer, worker):
                part.stop()
            await gateway.notifications.stop()
            if probes is not None:
                probes.stop()
            gateway.broker_check.close()
            wakeups.close_all()  # the last commits' wake-ups
            projecting.dispose()
            engine.dispose()

    application = app_.create_app(gateway, lifespan)
    instrument(application)
    return application


def instrument(application: FastAPI, tracer_provider: trace.TracerProvider | None = None) -> None:
    """Record a span per request (the global tracer provider's, unless given).

    Spans are masked on export (castad_runtime.telemetry).
    """
    # The probes, the scrapes and the console's static files are no work of a pipeline: no spans for them.
    FastAPIInstrumentor.instrument_app(
        application, excluded_urls="healthz,readyz,metrics,/ui", tracer_provider=tracer_provider
    )


def run(config: settings_.ApiSettings) -> None:
    process.start_observability("api", config.log_level)
    # Uvicorn stops gracefully on SIGTERM/SIGINT, then raises the signal again for the handler that
    # was there before it: this one, so that a clean stop exits with status 0 like every other service.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        uvicorn.run(
            build(config),
            host=config.host,
            port=config.port,
            log_config=None,
            timeout_graceful_shutdown=5,
            proxy_headers=True,
            forwarded_allow_ips=config.forwarded_allow_ips,
        )
    finally:
        telemetry.shutdown()


app = cli.service_app("api", settings_.ApiSettings, run, MIGRATIONS)
app.add_typer(key_commands.app, name="keys")
app.add_typer(secret_commands.app, name="webhook-secrets")
app.add_typer(tenant_commands.app, name="tenants")


@app.command("link-secrets")
def link_secrets() -> None:
    """Print each signing stage's link key, derived from CASTAD_API_LINK_SECRET, as the variable that sets it.

    Give each stage its own line only (a Secret per stage): no stage holds another's key or the root."""
    config = cli.load_settings(settings_.ApiSettings)
    if config.link_secret is None:
        typer.echo("CASTAD_API_LINK_SECRET is not set", err=True)
        raise typer.Exit(2)
    for name, key in links.stage_keys(config.link_secret).items():
        typer.echo(f"{name}={key}")
