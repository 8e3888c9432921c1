"""lyric service: whose work each job is, for fair turns across tenants, and the provider calls no event told yet.

Revision ID: 0021
"""

from castad_runtime.stage import schema

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_fair_share_v21()


def downgrade() -> None:
    schema.drop_fair_share_v21()
