"""api service: notices to a brief's callback_url when its pipeline ends, and each try of them.

Revision ID: 0004
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("pipelines", sa.Column("callback_url", sa.Text))
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("pipeline_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("payload", pg.JSONB, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("due_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", TZ),
    )
    op.create_index(
        "webhook_deliveries_due", "webhook_deliveries", ["due_at"], postgresql_where=sa.text("status = 'pending'")
    )
    op.create_index("webhook_deliveries_by_pipeline", "webhook_deliveries", ["pipeline_id", "created_at"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("delivery_id", pg.UUID(as_uuid=True), sa.ForeignKey("webhook_deliveries.id"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("started_at", TZ, nullable=False),
        sa.Column("duration_ms", sa.Integer, nullable=False),
        sa.Column("status_code", sa.Integer),
        sa.Column("error", sa.Text),
        sa.UniqueConstraint("delivery_id", "number"),
    )


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_column("pipelines", "callback_url")
