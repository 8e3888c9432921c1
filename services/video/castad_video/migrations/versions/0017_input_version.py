"""video service: the version of its trigger a job's input is stored as.

Revision ID: 0017
"""

from castad_runtime.stage import schema

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_input_version_v17()


def downgrade() -> None:
    schema.drop_input_version_v17()
