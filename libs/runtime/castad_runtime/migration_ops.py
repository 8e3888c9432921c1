"""Schema changes shared by the services' Alembic migrations.

Each function is one frozen revision of a set of tables: once a migration calls it,
it never changes. A later schema change gets a new function and a new migration.
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


def create_stage_tables_v1() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("pipeline_id", sa.Text, nullable=False, unique=True),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("due_at", TZ, nullable=False),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_expires_at", TZ),
        sa.Column("input", pg.JSONB, nullable=False),
        sa.Column("result", pg.JSONB),
        sa.Column("last_error_code", sa.Text),
        sa.Column("last_error_message", sa.Text),
        sa.Column("traceparent", sa.Text),
        sa.Column("tracestate", sa.Text),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", TZ),
    )
    op.create_index("jobs_due", "jobs", ["due_at"], postgresql_where=sa.text("status IN ('PENDING', 'RETRY_WAIT')"))
    op.create_index("jobs_leased", "jobs", ["lease_expires_at"], postgresql_where=sa.text("status = 'RUNNING'"))
    op.create_table(
        "attempts",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("job_id", pg.UUID(as_uuid=True), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("worker", sa.Text, nullable=False),
        sa.Column("started_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", TZ),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("error_code", sa.Text),
        sa.Column("error_message", sa.Text),
        sa.UniqueConstraint("job_id", "number", name="attempts_job_number"),
    )


def drop_v1(*table_names: str) -> None:
    for name in table_names:
        op.drop_table(name)
