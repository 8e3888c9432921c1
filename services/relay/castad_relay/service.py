"""Composition root of the relay."""

from __future__ import annotations

import asyncio
import signal

from castad_runtime import cli, process, telemetry

from castad_relay import relay
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
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await relay.run(config, stop)


app = cli.service_app("relay", settings_.RelaySettings, run, None)
