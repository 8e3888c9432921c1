"""lyric service: when the work an earlier attempt left at the provider was submitted.

Revision ID: 0019
"""

from castad_runtime import migration_ops

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_previous_submitted_at_v19()


def downgrade() -> None:
    migration_ops.drop_previous_submitted_at_v19()
