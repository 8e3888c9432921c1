"""Composition root of the relay."""

from __future__ import annotations

import asyncio
import signal

from castad_runtime import cli, db, health, process, release, telemetry

from castad_relay import metrics, relay
from castad_relay import settings as settings_


def run(config: settings_.RelaySettings) -> None:
    process.start_observability("relay", config.log_level)
    try:
        asyncio.run(_main(config))
    finally:
        telemetry.shutdown()


async def _main(config: settings_.RelaySettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    measured = metrics.instruments(config.sources)
    probes = None
    if config.health_port is not None:
        databases = {f"database {db.database_name(url)}": health.database(url) for url in config.sources.values()}
        probes = health.ProbeServer(
            config.health_port,
            liveness={"event loop": health.loop_responsive(loop)},
            readiness={**databases, "rabbitmq": health.rabbitmq(config.amqp_url)},
            registry=measured.registry,
            release=release.of("relay"),
        )
        probes.start()

    def on_signal() -> None:
        if probes is not None:
            probes.stopping.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    process.start_up_done()
    try:
        await relay.run(config, stop, measured)
    finally:
        if probes is not None:
            probes.stop()


app = cli.service_app("relay", settings_.RelaySettings, run, None)
