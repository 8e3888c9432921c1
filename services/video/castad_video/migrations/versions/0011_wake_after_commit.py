"""video service: the outbox no longer NOTIFYs inside the writing transaction; the writer wakes the relay after it.

A notifying commit waits for every other one under a lock of the whole server (castad_runtime.wakeups).
Contract: a service of the previous version, still running during the upgrade, writes rows that wake no
relay; the relay finds them by its fallback poll (CASTAD_RELAY_FALLBACK_POLL_S), seconds later.

Revision ID: 0011
"""

from castad_runtime import db, migration_ops

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.drop_outbox_notify_v6()


def downgrade() -> None:
    migration_ops.add_outbox_notify_v6(db.OUTBOX_CHANNEL)
