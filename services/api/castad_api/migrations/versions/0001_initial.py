"""api service: pipelines, their projection and timeline, inbox and outbox.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op
from castad_runtime import migration_ops
from sqlalchemy.dialects import postgresql as pg

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    migration_ops.create_outbox_v1()
    migration_ops.create_inbox_v1()
    op.create_table(
        "pipelines",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
        sa.Column("request_hash", sa.Text, nullable=False),
        sa.Column("brief", pg.JSONB, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("current_stage", sa.Text),
        sa.Column("progress", sa.Integer, nullable=False, server_default="0"),
        sa.Column("error_code", sa.Text),
        sa.Column("error_message", sa.Text),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", TZ),
    )
    op.create_index("pipelines_listing", "pipelines", ["created_at", "id"])
    op.create_table(
        "pipeline_stages",
        sa.Column("pipeline_id", pg.UUID(as_uuid=True), sa.ForeignKey("pipelines.id"), primary_key=True),
        sa.Column("stage", sa.Text, primary_key=True),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False, server_default="0"),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("step", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer),
        sa.Column("last_error_code", sa.Text),
        sa.Column("last_error_message", sa.Text),
        sa.Column("next_attempt_at", TZ),
        sa.Column("started_at", TZ),
        sa.Column("finished_at", TZ),
        sa.Column("artifact", pg.JSONB),
    )
    op.create_table(
        "pipeline_events",
        sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("pipeline_id", pg.UUID(as_uuid=True), sa.ForeignKey("pipelines.id"), nullable=False),
        sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False, unique=True),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("data", pg.JSONB, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("pipeline_events_by_pipeline", "pipeline_events", ["pipeline_id", "seq"])


def downgrade() -> None:
    migration_ops.drop_v1("pipeline_events", "pipeline_stages", "pipelines", "inbox", "outbox")
