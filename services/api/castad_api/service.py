"""Composition root of the gateway: HTTP API plus the consumer that feeds its projection."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator

import uvicorn
from castad_contracts import events, topology
from castad_runtime import artifacts, cli, db, messaging, process
from fastapi import FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

from castad_api import app as app_
from castad_api import notifications, projection
from castad_api import settings as settings_

MIGRATIONS = pathlib.Path(__file__).parent / "migrations"


def build(config: settings_.ApiSettings) -> FastAPI:
    engine = db.make_engine(config.database_url, pool_size=config.consumer_threads + 8)
    gateway = app_.Gateway(
        config=config,
        engine=engine,
        notifications=notifications.PipelineNotifications(config.database_url),
        store=artifacts.ArtifactStore(config.artifacts_dir),
    )
    topo = topology.Topology(config.namespace)
    messaging.declare_topology(config.amqp_url, topo)
    broker = messaging.make_broker(config.amqp_url)
    handlers: dict[str, messaging.Handler] = {
        events.stage_event(stage, fact): lambda env, payload: projection.apply(engine, env, payload)
        for stage in events.Stage
        for fact in ("started", "retrying", "completed", "failed")
    }
    messaging.EventConsumer(broker, "api", topo, handlers)
    consumer = process.ConsumerWorker(broker, config.consumer_threads)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        gateway.notifications.start()
        consumer.start()
        try:
            yield
        finally:
            consumer.stop()
            await gateway.notifications.stop()
            engine.dispose()

    application = app_.create_app(gateway, lifespan)
    FastAPIInstrumentor.instrument_app(application, excluded_urls="healthz,readyz")
    return application


def run(config: settings_.ApiSettings) -> None:
    process.start_observability("api", config.log_level)
    try:
        uvicorn.run(build(config), host=config.host, port=config.port, log_config=None, timeout_graceful_shutdown=5)
    finally:
        from castad_runtime import telemetry

        telemetry.shutdown()


app = cli.service_app("api", settings_.ApiSettings, run, MIGRATIONS)
