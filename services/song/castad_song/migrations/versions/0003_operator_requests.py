"""song service: operator requests (cancel, retry) on jobs; outbox rows for one queue.

Revision ID: 0003
"""

from castad_runtime import migration_ops
from castad_runtime.stage import schema

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_operator_requests_v3()
    migration_ops.add_outbox_destination_v3()


def downgrade() -> None:
    migration_ops.drop_outbox_destination_v3()
    schema.drop_operator_requests_v3()
