"""lyric service: the relays that drain this outbox keep a row each, so that they share the outboxes out.

Expand only: a relay of the previous version ignores the table and leads whatever lease it finds free; a relay
of this version cannot lead this outbox without it (docs/deploy.md).

Revision ID: 0013
"""

from castad_runtime import migration_ops

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_outbox_relay_v13()


def downgrade() -> None:
    migration_ops.drop_outbox_relay_v13()
