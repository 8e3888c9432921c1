"""Where the tests' servers are, and the failure (never a skip) when one is missing.

PostgreSQL is the tests' own server that `make setup` starts on 127.0.0.1:5433, without fsync (infra/local/setup.sh);
CASTAD_TEST_PG_URL names another (a superuser's URL without a database). RabbitMQ is the machine's; CASTAD_AMQP_URL
names another.
"""

from __future__ import annotations

import os
import socket

import pytest
from sqlalchemy.engine import make_url

AMQP_URL = os.environ.get("CASTAD_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
PG_URL = os.environ.get("CASTAD_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5433")


def _reachable(url: str, default_port: int) -> bool:
    parsed = make_url(url.replace("amqp://", "postgresql://", 1))
    try:
        with socket.create_connection((parsed.host or "127.0.0.1", parsed.port or default_port), timeout=3):
            return True
    except OSError:
        return False


def require_servers() -> None:
    """Fail the test unless the tests' PostgreSQL and RabbitMQ answer."""
    missing = [
        f"{name} ({make_url(url.replace('amqp://', 'postgresql://', 1)).port or port})"
        for name, url, port in (("PostgreSQL", PG_URL, 5432), ("RabbitMQ", AMQP_URL, 5672))
        if not _reachable(url, port)
    ]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not reachable: run `make setup` (or `make test`, which runs it)")


def database_url(name: str) -> str:
    """The URL of database `name` on the tests' PostgreSQL, as its superuser."""
    return f"{PG_URL}/{name}"
