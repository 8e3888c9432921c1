"""api service: its live replicas, each with its release and the event versions it reads.

The relays read them before they publish an event to this service: an event none of its replicas reads waits in
its outbox, visibly, until one that does runs. Expand only: a replica of the previous release keeps no row, and a
relay finds no word from it, as before.

Revision ID: 0018
"""

from castad_runtime import migration_ops

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_replicas_v18()


def downgrade() -> None:
    migration_ops.drop_replicas_v18()
