"""lyric service: attempts the machinery lost are not counted; outbox rows the broker refuses back off and park.

Revision ID: 0002
"""

from castad_runtime import migration_ops
from castad_runtime.stage import schema

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_counted_attempts_v2()
    migration_ops.add_outbox_parking_v2()


def downgrade() -> None:
    migration_ops.drop_outbox_parking_v2()
    schema.drop_counted_attempts_v2()
