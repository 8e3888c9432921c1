"""lyric service: jobs, attempts, inbox and outbox.

Revision ID: 0001
"""

from castad_runtime import migration_ops
from castad_runtime.stage import schema

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.create_outbox_v1()
    migration_ops.create_inbox_v1()
    schema.create_stage_tables_v1()


def downgrade() -> None:
    migration_ops.drop_v1("attempts", "jobs", "inbox", "outbox")
