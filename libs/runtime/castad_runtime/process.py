"""Process lifecycle shared by the services: set-up, a Dramatiq worker, clean stop on a signal."""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from castad_runtime import health, logs, telemetry

log = logging.getLogger(__name__)


class Background(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


def worker_id(service: str) -> str:
    return f"{service}@{socket.gethostname()}:{os.getpid()}"


def start_observability(service: str, log_level: str) -> None:
    logs.setup(service, log_level)
    telemetry.setup(service)


def start_up_done() -> None:
    """Call once a service has started.

    What start-up made (modules, settings, engines, the app) lives as long as the process, so the garbage collector
    stops going through it (`gc.freeze`). Every full collection under load went over those objects again, to free
    none of them.
    """
    gc.freeze()


class ConsumerWorker:
    """A Dramatiq worker consuming the service's queue inside this process.

    Its threads wait for work with Dramatiq's default timeout, a second: each wakes that often to see whether
    the worker stops. With 0.1 s, a service at rest used 10-20 ms of CPU a second on those wake-ups alone
    (a third of that with a second); the price is up to a second more to stop."""

    def __init__(self, broker: RabbitmqBroker, threads: int) -> None:
        self.worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=1000)

    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        self.worker.stop(timeout=10_000)

    def threads(self) -> list[threading.Thread]:
        """Dramatiq's consumer and worker threads (for the liveness probe)."""
        return [*self.worker.consumers.values(), *self.worker.workers]


def run_until_signalled(
    service: str,
    parts: Sequence[Background],
    on_stop: Callable[[], None] | None = None,
    probes: health.ProbeServer | None = None,
) -> None:
    """Start the parts, block until SIGTERM or SIGINT, stop them in reverse order.

    The probes answer from before the first part starts until the last one stopped; from
    the signal on, readiness says "stopping".
    """
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    started: list[Background] = []
    if probes is not None:
        probes.start()
    try:
        for part in parts:
            part.start()
            started.append(part)
        start_up_done()
        log.info("%s running", service)
        stop.wait()
        log.info("%s stopping", service)
    finally:
        if probes is not None:
            probes.stopping.set()
        for part in reversed(started):
            part.stop()
        if on_stop:
            on_stop()
        if probes is not None:
            probes.stop()
        telemetry.shutdown()
