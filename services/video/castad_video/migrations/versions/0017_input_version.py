"""video service: the version of its trigger a job's input is stored as.

Revision ID: 0017
"""

from castad_runtime import migration_ops

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_input_version_v17()


def downgrade() -> None:
    migration_ops.drop_input_version_v17()
