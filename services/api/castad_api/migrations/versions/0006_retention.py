"""api service: what retention deletes by: published outbox rows, handled event ids, ended pipelines and
their timelines, settled dead letters.

Revision ID: 0006
"""

import sqlalchemy as sa
from alembic import op
from castad_runtime import migration_ops

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_retention_v5()
    op.create_index(
        "pipelines_ended",
        "pipelines",
        ["finished_at"],
        postgresql_where=sa.text("status IN ('SUCCEEDED', 'FAILED', 'CANCELED')"),
    )
    op.create_index("pipeline_events_created", "pipeline_events", ["created_at"])
    op.create_index(
        "dead_letters_settled",
        "dead_letters",
        ["updated_at"],
        postgresql_where=sa.text("status IN ('replayed', 'discarded')"),
    )


def downgrade() -> None:
    op.drop_index("dead_letters_settled", "dead_letters")
    op.drop_index("pipeline_events_created", "pipeline_events")
    op.drop_index("pipelines_ended", "pipelines")
    migration_ops.drop_retention_v5()
