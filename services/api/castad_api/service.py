"""Composition root of the gateway: HTTP API, the consumer that feeds its projection, the recorder of
dead letters and the sweeper of overdue pipelines."""

from __future__ import annotations

import contextlib
import pathlib
import signal
import typing
from collections.abc import AsyncIterator

import uvicorn
from castad_contracts import events, topology
from castad_runtime import artifacts, cli, consumer, db, messaging, process, telemetry
from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

from castad_api import app as app_
from castad_api import dead_letters, deadlines, deps, key_commands, notifications, projection, webhooks
from castad_api import settings as settings_

MIGRATIONS = pathlib.Path(__file__).parent / "migrations"


def build(config: settings_.ApiSettings) -> FastAPI:
    engine = db.make_engine(config.database_url, pool_size=config.consumer_threads + 8)
    gateway = deps.Gateway(
        config=config,
        engine=engine,
        notifications=notifications.PipelineNotifications(config.database_url),
        store=artifacts.make_store(config),
    )
    topo = topology.Topology(config.namespace)
    messaging.declare_topology_when_reachable(config.amqp_url, topo)
    broker = messaging.make_broker(config.amqp_url)
    handlers: dict[str, consumer.Handler] = {
        events.stage_event(stage, fact): lambda env, payload: projection.apply(engine, env, payload)
        for stage in events.Stage
        for fact in typing.get_args(events.StageFact)
    }
    consumer.EventConsumer(
        broker, "api", topo, handlers, max_retries=config.handler_retries, hold_s=config.hold_events_s
    )
    worker = process.ConsumerWorker(broker, config.consumer_threads)
    recorder = dead_letters.Recorder(config.amqp_url, topo.dead_letter_queue, engine, config.dead_letter_body_max_bytes)
    sweeper = deadlines.DeadlineSweeper(engine, config.deadline_poll_s)
    deliverer = webhooks.Deliverer(engine, config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        gateway.notifications.start()
        for part in (worker, recorder, sweeper, deliverer):
            part.start()
        try:
            yield
        finally:
            for part in (deliverer, sweeper, recorder, worker):
                part.stop()
            await gateway.notifications.stop()
            engine.dispose()

    application = app_.create_app(gateway, lifespan)
    FastAPIInstrumentor.instrument_app(application, excluded_urls="healthz,readyz")
    return application


def run(config: settings_.ApiSettings) -> None:
    process.start_observability("api", config.log_level)
    # Uvicorn stops gracefully on SIGTERM/SIGINT, then raises the signal again for the handler that
    # was there before it: this one, so that a clean stop exits with status 0 like every other service.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        uvicorn.run(build(config), host=config.host, port=config.port, log_config=None, timeout_graceful_shutdown=5)
    finally:
        telemetry.shutdown()


app = cli.service_app("api", settings_.ApiSettings, run, MIGRATIONS)
app.add_typer(key_commands.app, name="keys")
