"""song service: a draft waiting for a person's decision is kept in its job's row.

Revision ID: 0020
"""

from castad_runtime.stage import schema

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_reviews_v20()


def downgrade() -> None:
    schema.drop_reviews_v20()
