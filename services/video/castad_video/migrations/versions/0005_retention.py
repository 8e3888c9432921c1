"""video service: what retention deletes by: published outbox rows, handled event ids, finished jobs and their files.

Revision ID: 0005
"""

from castad_runtime import migration_ops
from castad_runtime.stage import schema

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_retention_v5()
    schema.add_job_retention_v5()


def downgrade() -> None:
    schema.drop_job_retention_v5()
    migration_ops.drop_retention_v5()
