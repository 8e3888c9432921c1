"""lyric service: when the work an earlier attempt left at the provider was submitted.

Revision ID: 0019
"""

from castad_runtime.stage import schema

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_previous_submitted_at_v19()


def downgrade() -> None:
    schema.drop_previous_submitted_at_v19()
