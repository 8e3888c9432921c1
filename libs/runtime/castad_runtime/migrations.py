"""Create a service's database and bring it to the newest Alembic revision."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import sqlalchemy as sa
from alembic import command, context
from alembic.config import Config
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from castad_runtime import db

# Held while a service's migrations run: two migrators (a hook Job run twice, a Job beside a
# local `migrate`) take turns, and the second finds nothing left to do.
MIGRATION_LOCK = 0x0CA57AD0


def ensure_database(database_url: str, template: str | None = None) -> bool:
    """Create the database named in the URL if it does not exist. True if created.

    Where the server's maintenance database is closed to this user (a managed PostgreSQL whose
    databases are made by its operators), a database that takes a connection is taken as there.
    """
    url = make_url(database_url)
    admin = db.maintenance_engine(database_url)
    try:
        try:
            conn = admin.connect()
        except sa.exc.OperationalError:
            if template is None and _accepts_connections(url):
                return False
            raise
        with conn:
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
    """Drop the database named in the URL, if it exists, ending its sessions."""
    admin = db.maintenance_engine(database_url)
    try:
        with admin.connect() as conn:
            quoted = conn.dialect.identifier_preparer.quote(db.database_name(database_url))
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
    finally:
        admin.dispose()


# The outbox columns the relay writes (castad_relay.statements): marking, backing off, parking.
RELAY_COLUMNS = ("published_at", "publish_attempts", "last_error", "retry_at", "parked_at")


class AccessNotRestricted(Exception):
    """`restrict_access` could not close the database as asked; the message says what a superuser must do."""


def restrict_access(database_url: str, relay_role: str) -> None:
    """Close the database to everyone but its owner and `relay_role`.

    `relay_role` may read the outbox, mark its rows, hold the lease of its leadership (`outbox_leader`) and keep
    its own row among the live relays (`outbox_relay`), and read what the service's replicas read (`replicas`),
    nothing else. Run by the owner (the service's `migrate`) or a superuser.

    No role but the owner may create objects in the public schema either: PostgreSQL before 15 lets
    PUBLIC do it (and a cluster upgraded from one keeps the grant), so the relay's role could. Only the
    schema's owner or a superuser can take that back; where the one running this cannot, it raises
    AccessNotRestricted, the rest done."""
    engine = sa.create_engine(database_url, poolclass=NullPool, connect_args=db.connect_args(database_url))
    try:
        with engine.begin() as conn:
            quote = conn.dialect.identifier_preparer.quote
            database, relay = quote(conn.scalar(sa.text("SELECT current_database()"))), quote(relay_role)
            conn.exec_driver_sql(f"REVOKE ALL ON DATABASE {database} FROM PUBLIC")
            conn.exec_driver_sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC")  # not the schema's owner: a warning
            conn.exec_driver_sql(f"GRANT CONNECT ON DATABASE {database} TO {relay}")
            conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA public TO {relay}")
            conn.exec_driver_sql(f"GRANT SELECT, UPDATE ({', '.join(RELAY_COLUMNS)}) ON outbox TO {relay}")
            conn.exec_driver_sql(f"GRANT SELECT, INSERT, UPDATE ON outbox_leader TO {relay}")
            conn.exec_driver_sql(f"GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay TO {relay}")
            conn.exec_driver_sql(f"GRANT SELECT ON replicas TO {relay}")
        with engine.connect() as conn:
            if conn.scalar(sa.text("SELECT has_schema_privilege('public', 'public', 'CREATE')")):
                who = quote(conn.scalar(sa.text("SELECT current_user")))
                raise AccessNotRestricted(
                    f"every role may still create objects in schema public of database {database} (PostgreSQL"
                    f" before 15 grants it), and {who} cannot revoke that: it does not own the schema. As a"
                    f" superuser, in that database: ALTER SCHEMA public OWNER TO {who}; then migrate again"
                )
    finally:
        engine.dispose()


def _accepts_connections(url: sa.URL) -> bool:
    engine = sa.create_engine(url, poolclass=NullPool, connect_args=db.connect_args(url.render_as_string(False)))
    try:
        with engine.connect():
            return True
    except sa.exc.OperationalError:
        return False
    finally:
        engine.dispose()


def upgrade(database_url: str, migrations_dir: pathlib.Path, revision: str = "head") -> None:
    """Apply the migrations up to `revision`, holding the service's migration lock meanwhile."""
    _under_lock(database_url, migrations_dir, command.upgrade, revision)


def downgrade(database_url: str, migrations_dir: pathlib.Path, revision: str) -> None:
    _under_lock(database_url, migrations_dir, command.downgrade, revision)


def _under_lock(
    database_url: str, migrations_dir: pathlib.Path, action: Callable[[Config, str], None], revision: str
) -> None:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir))
    engine = sa.create_engine(database_url, poolclass=NullPool, connect_args=db.connect_args(database_url))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
            conn.commit()
            try:
                config.attributes["connection"] = conn
                action(config, revision)
                conn.commit()
            finally:
                conn.rollback()
                conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
                conn.commit()
    finally:
        engine.dispose()


def run_env() -> None:
    """Body of every service's migrations/env.py (online mode only), on the connection `upgrade` holds."""
    conn = context.config.attributes.get("connection")
    if conn is None:
        raise RuntimeError("run migrations through `python -m castad_<service> migrate`")
    context.configure(connection=conn)
    with context.begin_transaction():
        context.run_migrations()
