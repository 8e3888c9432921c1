"""api service: the API key that acted on a dead letter, and the gateway's own keys (keyring.py).

Expand only: a gateway of the previous version records actions without a key (null) and ignores
the keyring.

Revision ID: 0011
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("dead_letter_actions", sa.Column("key_id", pg.UUID(as_uuid=True)))
    op.add_column("dead_letter_actions", sa.Column("key_name", sa.Text))
    op.create_table(
        "gateway_keys",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("secret", sa.LargeBinary, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table("gateway_keys")
    op.drop_column("dead_letter_actions", "key_name")
    op.drop_column("dead_letter_actions", "key_id")
