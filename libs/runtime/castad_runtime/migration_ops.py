"""Schema changes shared by the services' Alembic migrations: the tables every service's database has.

Each function is one frozen revision of a set of tables: once a migration calls it,
it never changes. A later schema change gets a new function and a new migration.

Here the outbox, the inbox and the live replicas, which the gateway and the stages keep alike; a stage service's
own tables (its jobs and attempts, the providers' quotas, the tenants' shares, the injected faults) change through
castad_runtime.stage.schema.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

TZ = sa.DateTime(timezone=True)


def create_outbox_v1() -> None:
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False, unique=True),
        sa.Column("pipeline_id", sa.Text, nullable=False),
        sa.Column("routing_key", sa.Text, nullable=False),
        sa.Column("envelope", pg.JSONB, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("published_at", TZ),
    )
    op.create_index("outbox_unpublished", "outbox", ["id"], postgresql_where=sa.text("published_at IS NULL"))


def create_inbox_v1() -> None:
    op.create_table(
        "inbox",
        sa.Column("event_id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("pipeline_id", sa.Text, nullable=False),
        sa.Column("received_at", TZ, nullable=False, server_default=sa.func.now()),
    )


def drop_v1(*table_names: str) -> None:
    for name in table_names:
        op.drop_table(name)


def add_outbox_parking_v2() -> None:
    """Per-row publish retries and parking: a row the broker refuses backs off, then waits for an operator."""
    op.add_column("outbox", sa.Column("publish_attempts", sa.Integer, nullable=False, server_default="0"))
    op.add_column("outbox", sa.Column("last_error", sa.Text))
    op.add_column("outbox", sa.Column("retry_at", TZ))
    op.add_column("outbox", sa.Column("parked_at", TZ))
    op.drop_index("outbox_unpublished", "outbox")
    op.create_index(
        "outbox_unpublished", "outbox", ["id"], postgresql_where=sa.text("published_at IS NULL AND parked_at IS NULL")
    )
    op.create_index(
        "outbox_held",
        "outbox",
        ["pipeline_id", "id"],
        postgresql_where=sa.text("published_at IS NULL AND (parked_at IS NOT NULL OR retry_at IS NOT NULL)"),
    )


def drop_outbox_parking_v2() -> None:
    op.drop_index("outbox_held", "outbox")
    op.drop_index("outbox_unpublished", "outbox")
    op.create_index("outbox_unpublished", "outbox", ["id"], postgresql_where=sa.text("published_at IS NULL"))
    for column in ("parked_at", "retry_at", "last_error", "publish_attempts"):
        op.drop_column("outbox", column)


def add_outbox_destination_v3() -> None:
    """A row may go to one queue (a replayed dead letter) instead of the events exchange."""
    op.add_column("outbox", sa.Column("destination", sa.Text))


def drop_outbox_destination_v3() -> None:
    op.drop_column("outbox", "destination")


def add_retention_v5() -> None:
    """What retention deletes by, in every service.

    Outbox rows by when they were published, event ids by when they came. Partial where it can be, so that the hot
    path's writes pay little.
    """
    op.create_index(
        "outbox_published", "outbox", ["published_at"], postgresql_where=sa.text("published_at IS NOT NULL")
    )
    op.create_index("inbox_received", "inbox", ["received_at"])


def drop_retention_v5() -> None:
    op.drop_index("inbox_received", "inbox")
    op.drop_index("outbox_published", "outbox")


OUTBOX_NOTIFY_FUNCTION = "castad_outbox_notify"


def add_outbox_notify_v6(channel: str) -> None:
    """The outbox announces its own new rows.

    A statement-level trigger NOTIFYs `channel` when rows are inserted, inside the writing transaction (delivered
    at its commit, one notification per transaction whatever the rows), so a writer spends no round trip of its own
    on waking the relay.
    """
    op.execute(
        f"CREATE FUNCTION {OUTBOX_NOTIFY_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN PERFORM pg_notify('{channel}', ''); RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER outbox_notify AFTER INSERT ON outbox"
        f" FOR EACH STATEMENT EXECUTE FUNCTION {OUTBOX_NOTIFY_FUNCTION}()"
    )


def drop_outbox_notify_v6() -> None:
    op.execute("DROP TRIGGER IF EXISTS outbox_notify ON outbox")
    op.execute(f"DROP FUNCTION IF EXISTS {OUTBOX_NOTIFY_FUNCTION}()")


def add_outbox_leader_v7() -> None:
    """Who relays this database's outbox: one row, the leader's lease and its term (a fencing token)."""
    op.create_table(
        "outbox_leader",
        sa.Column("id", sa.Boolean, primary_key=True, server_default=sa.true()),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
        sa.Column("renewed_at", TZ, nullable=False),
        sa.CheckConstraint("id", name="outbox_leader_one_row"),
    )


def drop_outbox_leader_v7() -> None:
    op.drop_table("outbox_leader")


def add_outbox_relay_v13() -> None:
    """The relays that drain this database's outbox: one row per live relay, ending like a lease."""
    op.create_table(
        "outbox_relay",
        sa.Column("holder", sa.Text, primary_key=True),
        sa.Column("expires_at", TZ, nullable=False),
    )


def drop_outbox_relay_v13() -> None:
    op.drop_table("outbox_relay")


def add_replicas_v18() -> None:
    """The service's live replicas, their release and what each reads (`replicas`).

    Expand only: a replica of the previous release keeps no row, and a relay that finds none publishes as before.
    """
    op.create_table(
        "replicas",
        sa.Column("replica", sa.Text, primary_key=True),
        sa.Column("release", sa.Text, nullable=False),
        sa.Column("reads", pg.JSONB, nullable=False),
        sa.Column("started_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("seen_at", TZ, nullable=False, server_default=sa.func.now()),
    )


def drop_replicas_v18() -> None:
    op.drop_table("replicas")
