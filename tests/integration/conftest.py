"""Fixtures of the integration tests.

Engines on the installation's databases, a broker connection, the relay running in this process, and Dramatiq's
global state put back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import dramatiq
import dramatiq.broker
import dramatiq.message
import pytest
import sqlalchemy as sa
from castad_relay import metrics as relay_metrics
from castad_relay import relay
from castad_relay import settings as relay_settings
from castad_runtime import consumer, db, messaging, process
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from tests.integration import gateway as gateway_
from tests.integration.helpers import Amqp, LoopThread
from tests.support.installation import Installation


class Engines(Mapping[str, sa.Engine]):
    """One engine per service database, each made (with its database) when a test first asks for it."""

    def __init__(self, installation: Installation) -> None:
        self.installation = installation
        self.made: dict[str, sa.Engine] = {}

    def __getitem__(self, service: str) -> sa.Engine:
        if service not in self.made:
            self.made[service] = db.make_engine(self.installation.database_urls[service])
        return self.made[service]

    def __iter__(self) -> Iterator[str]:
        return iter(self.installation.database_urls)

    def __len__(self) -> int:
        return len(self.installation.database_urls)

    def dispose(self) -> None:
        for engine in self.made.values():
            engine.dispose()


@pytest.fixture
def engines(installation: Installation) -> Iterator[Engines]:
    """One engine per service database (made on first use), disposed after the test."""
    made = Engines(installation)
    try:
        yield made
    finally:
        made.dispose()


@pytest.fixture
def amqp(installation: Installation) -> Iterator[Amqp]:
    connection = Amqp(installation.amqp_url)
    try:
        yield connection
    finally:
        connection.close()


class RunningRelay:
    """`relay.run` on an event loop of its own, stopped through the asyncio.Event it takes."""

    def __init__(self, config: relay_settings.RelaySettings, metrics: relay_metrics.RelayMetrics | None = None) -> None:
        self.config = config
        self._thread = LoopThread()
        self._stop = asyncio.Event()
        self._run = self._thread.submit(relay.run(config, self._stop, metrics))
        self._stopped = False

    def freeze(self, seconds: float) -> None:
        """Block the relay's event loop for `seconds`, as a paused machine (SIGSTOP) stops its whole process."""
        self._thread.call(lambda: time.sleep(seconds))

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._thread.call(self._stop.set)
        try:
            self._run.result(timeout=15)  # re-raises whatever ended the relay early
        finally:
            self._thread.close()


RelayConfig = Callable[..., relay_settings.RelaySettings]
StartRelay = Callable[..., RunningRelay]


@pytest.fixture
def relay_config(installation: Installation, monkeypatch: pytest.MonkeyPatch) -> RelayConfig:
    """Relay settings read from the installation's environment, as the relay reads them, plus overrides."""
    for name, value in installation.env().items():
        monkeypatch.setenv(name, value)

    def make(amqp_url: str | None = None, **fields: Any) -> relay_settings.RelaySettings:
        if amqp_url is not None:
            monkeypatch.setenv("CASTAD_AMQP_URL", amqp_url)
        fields.setdefault("retry_delay_s", 0.1)
        return relay_settings.RelaySettings(**fields)

    return make


@pytest.fixture
def start_relay(relay_config: RelayConfig) -> Iterator[StartRelay]:
    """Start relays (`relay.run`) in this process; every one is stopped after the test."""
    running: list[RunningRelay] = []

    def start(
        amqp_url: str | None = None, metrics: relay_metrics.RelayMetrics | None = None, **fields: Any
    ) -> RunningRelay:
        running.append(RunningRelay(relay_config(amqp_url, **fields), metrics))
        return running[-1]

    try:
        yield start
    finally:
        for each in reversed(running):
            each.stop()


class Consumers:
    """Runs a service's event consumer in this process, as its composition root runs it.

    A Dramatiq RabbitMQ broker, the EventConsumer actor on the service's queue, a Dramatiq worker.
    """

    def __init__(self, installation: Installation) -> None:
        self.installation = installation
        self.running: list[tuple[RabbitmqBroker, process.ConsumerWorker]] = []

    def __call__(
        self, service: str, handlers: Mapping[str, consumer.Handler], threads: int = 2, **options: Any
    ) -> consumer.EventConsumer:
        """`options` are EventConsumer's keyword arguments (max_retries, hold_s, registry)."""
        assert not self.running, "one consumer per test: Dramatiq's encoder is global"
        broker = messaging.make_broker(self.installation.amqp_url, self.installation.topology, service)
        started = consumer.EventConsumer(broker, service, self.installation.topology, handlers, **options)
        worker = process.ConsumerWorker(broker, threads)
        worker.start()
        self.running.append((broker, worker))
        return started

    def stop(self) -> None:
        """Stop the worker and close its connections: what it did not acknowledge is ready again."""
        for broker, worker in self.running:
            worker.stop()
            broker.close()
        self.running.clear()


@pytest.fixture
def run_consumer(installation: Installation) -> Iterator[Consumers]:
    """Start a consumer with `run_consumer(service, handlers)`; stopped after the test.

    EventConsumer sets Dramatiq's global broker and encoder; the previous ones are put back.
    """
    previous = dramatiq.broker.global_broker, dramatiq.message.global_encoder
    consumers = Consumers(installation)
    try:
        yield consumers
    finally:
        consumers.stop()
        dramatiq.broker.global_broker = previous[0]
        dramatiq.set_encoder(previous[1])


@pytest.fixture
def api(installation: Installation) -> Iterator[Callable[..., gateway_.RunningApi]]:
    """`api(**settings)`: the gateway's HTTP API served from this process on the installation's database."""
    running: list[gateway_.RunningApi] = []
    database_url = installation.database_urls["api"]  # made now, not inside what a test measures

    def start(**settings: Any) -> gateway_.RunningApi:
        running.append(gateway_.RunningApi(database_url, installation.artifacts_dir, **settings))
        return running[-1]

    try:
        yield start
    finally:
        for each in running:
            each.stop()


@pytest.fixture
def gateway(engines: Mapping[str, sa.Engine]) -> gateway_.Projection:
    """Pipelines accepted by the installation's gateway, and stage events applied to its projection."""
    return gateway_.Projection(engines["api"])
