"""A database made unreachable and back, the way an outage looks to its service.

`ALLOW_CONNECTIONS false` refuses new sessions and terminating the existing ones drops
every pooled connection: the service sees connection errors until the database is
allowed again, and the shared PostgreSQL server keeps running for everything else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa
from castad_runtime import db
from sqlalchemy.engine import make_url


def _admin(database_url: str) -> tuple[sa.Engine, str]:
    url = make_url(database_url)
    engine = sa.create_engine(
        url.set(database="postgres"),
        isolation_level="AUTOCOMMIT",
        poolclass=sa.pool.NullPool,
        connect_args=db.connect_args(database_url),  # the primary, where the database has a standby
    )
    return engine, url.database or ""


def block(database_url: str) -> None:
    """Refuse new connections to the database and end every open one."""
    engine, name = _admin(database_url)
    try:
        with engine.connect() as conn:
            quoted = conn.dialect.identifier_preparer.quote(name)
            conn.exec_driver_sql(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false")
            conn.execute(
                sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                {"name": name},
            )
    finally:
        engine.dispose()


def unblock(database_url: str) -> None:
    engine, name = _admin(database_url)
    try:
        with engine.connect() as conn:
            quoted = conn.dialect.identifier_preparer.quote(name)
            conn.exec_driver_sql(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true")
    finally:
        engine.dispose()


@contextlib.contextmanager
def database_down(database_url: str) -> Iterator[None]:
    block(database_url)
    try:
        yield
    finally:
        unblock(database_url)
