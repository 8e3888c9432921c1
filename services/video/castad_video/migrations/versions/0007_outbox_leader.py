"""video service: the relay's leadership of this outbox is a lease row with a term, not a session lock.

Expand only: a relay of the previous version still leads by its advisory lock and ignores the table;
while both versions run, both may publish for a moment, which only sends rows twice (docs/deploy.md).

Revision ID: 0007
"""

from castad_runtime import migration_ops

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_outbox_leader_v7()


def downgrade() -> None:
    migration_ops.drop_outbox_leader_v7()
