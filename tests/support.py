"""What the integration and end-to-end tests share besides fixtures: an isolated installation."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import socket

import pytest
from castad_contracts import topology
from castad_runtime import settings
from sqlalchemy.engine import make_url

AMQP_URL = os.environ.get("CASTAD_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
PG_URL = os.environ.get("CASTAD_TEST_PG_URL", settings.DEFAULT_PG)


def _reachable(url: str, default_port: int) -> bool:
    parsed = make_url(url.replace("amqp://", "postgresql://", 1))
    try:
        with socket.create_connection((parsed.host or "127.0.0.1", parsed.port or default_port), timeout=3):
            return True
    except OSError:
        return False


def require_servers() -> None:
    missing = [
        name
        for name, url, port in (("PostgreSQL", PG_URL, 5432), ("RabbitMQ", AMQP_URL, 5672))
        if not _reachable(url, port)
    ]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not reachable: run `make setup` (or `make test`, which runs it)")


def database_url(name: str) -> str:
    return f"{PG_URL}/{name}"


@dataclasses.dataclass(frozen=True)
class Installation:
    """One isolated Castad: a database per service, a namespace on the broker, a directory for files."""

    namespace: str
    database_urls: dict[str, str]
    artifacts_dir: pathlib.Path
    amqp_url: str = AMQP_URL

    @property
    def topology(self) -> topology.Topology:
        return topology.Topology(self.namespace)

    def env(self) -> dict[str, str]:
        """The CASTAD_* variables that point every service at this installation."""
        return {
            "CASTAD_AMQP_URL": self.amqp_url,
            "CASTAD_NAMESPACE": self.namespace,
            "CASTAD_ARTIFACTS_DIR": str(self.artifacts_dir),
            "CASTAD_RELAY_SOURCES": ",".join(self.database_urls.values()),
            **{f"CASTAD_{service.upper()}_DATABASE_URL": url for service, url in self.database_urls.items()},
        }
