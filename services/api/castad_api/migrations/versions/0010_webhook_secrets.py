"""api service: each tenant's Standard Webhooks secrets, sealed with CASTAD_API_WEBHOOK_SECRETS_KEY.

Expand only: a gateway of the previous version ignores the table and signs with the shared
CASTAD_API_WEBHOOK_SECRET, which the new one keeps signing with too while it is set (a migration aid).

Revision ID: 0010
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "webhook_secrets",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("sealed", sa.LargeBinary, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("expires_at", TZ),
    )
    op.create_index("webhook_secrets_by_tenant", "webhook_secrets", ["tenant", "created_at"])


def downgrade() -> None:
    op.drop_index("webhook_secrets_by_tenant", "webhook_secrets")
    op.drop_table("webhook_secrets")
