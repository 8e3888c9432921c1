"""Create a service's database and bring it to the newest Alembic revision."""

from __future__ import annotations

import pathlib

import sqlalchemy as sa
from alembic import command, context
from alembic.config import Config
from sqlalchemy.engine import make_url


def ensure_database(database_url: str, template: str | None = None) -> bool:
    """Create the database named in the URL if it does not exist. True if created."""
    url = make_url(database_url)
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": url.database}
            ).scalar()
            if exists:
                return False
            quoted = conn.dialect.identifier_preparer.quote(url.database or "")
            clause = f" TEMPLATE {conn.dialect.identifier_preparer.quote(template)}" if template else ""
            conn.exec_driver_sql(f"CREATE DATABASE {quoted}{clause}")
            return True
    finally:
        admin.dispose()


def drop_database(database_url: str) -> None:
    url = make_url(database_url)
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            quoted = conn.dialect.identifier_preparer.quote(url.database or "")
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
    finally:
        admin.dispose()


def upgrade(database_url: str, migrations_dir: pathlib.Path) -> None:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir))
    config.attributes["database_url"] = database_url
    command.upgrade(config, "head")


def run_env() -> None:
    """Body of every service's migrations/env.py (online mode only)."""
    url = context.config.attributes.get("database_url") or context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: run migrations through `python -m castad_<service> migrate`")
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            context.configure(connection=conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()
