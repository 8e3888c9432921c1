"""song service: the outbox NOTIFYs the relay itself, inside the writing transaction.

Expand only: a service of the previous version still sends its own NOTIFY after the commit; the
relay wakes once more, finds nothing more, and waits again.

Revision ID: 0006
"""

from castad_runtime import db, migration_ops

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_outbox_notify_v6(db.OUTBOX_CHANNEL)


def downgrade() -> None:
    migration_ops.drop_outbox_notify_v6()
