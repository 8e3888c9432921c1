"""lyric service: whose work each job is, for fair turns across tenants, and the provider calls no event told yet.

Revision ID: 0021
"""

from castad_runtime import migration_ops

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_fair_share_v21()


def downgrade() -> None:
    migration_ops.drop_fair_share_v21()
