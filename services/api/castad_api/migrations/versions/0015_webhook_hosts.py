"""api service: each webhook notice keeps its receiving host, read once by a URL parser.

`webhook_deliveries.host` is the key of the per-host places (castad_api.webhook_slots.host: the host in lower
case, IDNA-encoded, without a trailing dot, and its port written out), so that every spelling of one host
shares its places and the claim can pass over the notices of the hosts with no place left.

Expand only: the column is nullable and not filled here. A notice without one (made before the upgrade, or
by a gateway of the previous version during the rollout) is never passed over by the claim's query; its host
is read from its URL once claimed, by the same parser, and it waits for a place like any other.

Revision ID: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("webhook_deliveries", sa.Column("host", sa.Text))


def downgrade() -> None:
    op.drop_column("webhook_deliveries", "host")
