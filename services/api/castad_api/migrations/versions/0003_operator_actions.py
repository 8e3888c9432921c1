"""api service: cancel, retry and deadlines of pipelines; dead letters; outbox rows for one queue.

Revision ID: 0003
"""

import sqlalchemy as sa
from alembic import op
from castad_runtime import migration_ops
from sqlalchemy.dialects import postgresql as pg

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    migration_ops.add_outbox_destination_v3()
    op.add_column("pipelines", sa.Column("operations", sa.Integer, nullable=False, server_default="0"))
    op.add_column("pipelines", sa.Column("cancel_requested_at", TZ))
    op.add_column("pipelines", sa.Column("cancel_reason", sa.Text))
    op.add_column("pipelines", sa.Column("retries", sa.Integer, nullable=False, server_default="0"))
    op.add_column("pipelines", sa.Column("deadline_at", TZ))
    op.create_index(
        "pipelines_due",
        "pipelines",
        ["deadline_at"],
        postgresql_where=sa.text("status NOT IN ('SUCCEEDED', 'FAILED', 'CANCELED')"),
    )
    op.add_column("pipeline_stages", sa.Column("floor_attempt", sa.Integer, nullable=False, server_default="0"))
    op.add_column("pipeline_stages", sa.Column("operation", sa.Integer, nullable=False, server_default="0"))
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("message_id", sa.Text, nullable=False, unique=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("service", sa.Text),
        sa.Column("queue", sa.Text),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("event_id", pg.UUID(as_uuid=True)),
        sa.Column("event_type", sa.Text),
        sa.Column("schema_version", sa.Integer),
        sa.Column("pipeline_id", sa.Text),
        sa.Column("headers", pg.JSONB, nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("body_size", sa.Integer, nullable=False),
        sa.Column("received_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("status", sa.Text, nullable=False, server_default="dead"),
        sa.Column("replays", sa.Integer, nullable=False, server_default="0"),
        sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("dead_letters_by_status", "dead_letters", ["status", "id"])
    op.create_index("dead_letters_by_pipeline", "dead_letters", ["pipeline_id", "id"])
    op.create_table(
        "dead_letter_actions",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("dead_letter_id", sa.BigInteger, sa.ForeignKey("dead_letters.id"), nullable=False),
        sa.Column("action", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("at", TZ, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("dead_letter_actions_by_letter", "dead_letter_actions", ["dead_letter_id", "id"])


def downgrade() -> None:
    op.drop_table("dead_letter_actions")
    op.drop_table("dead_letters")
    op.drop_column("pipeline_stages", "operation")
    op.drop_column("pipeline_stages", "floor_attempt")
    op.drop_index("pipelines_due", "pipelines")
    for column in ("deadline_at", "retries", "cancel_reason", "cancel_requested_at", "operations"):
        op.drop_column("pipelines", column)
    migration_ops.drop_outbox_destination_v3()
