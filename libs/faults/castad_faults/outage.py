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


def _admin(database_url: str) -> tuple[sa.Engine, str]:
    # The primary, where the database has a standby (db.connect_args, which the engine keeps).
    return db.maintenance_engine(database_url), db.database_name(database_url)


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
