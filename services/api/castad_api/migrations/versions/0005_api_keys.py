"""api service: API keys with tenants and scopes, a per-key creation limit, pipelines of a tenant.

Pipelines made before keys existed belong to the tenant `default`. Expand only: a gateway of the
previous version keeps creating pipelines (of the tenant `default`) until it is replaced; the
unique Idempotency-Key column stays, each tenant's keys are told apart inside it.

Revision ID: 0005
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("scopes", pg.ARRAY(sa.Text), nullable=False),
        sa.Column("digest", sa.Text, nullable=False, unique=True),
        sa.Column("shown", sa.Text, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.Column("revoked_at", TZ),
    )
    op.create_table(
        "api_key_windows",
        sa.Column("key_id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("window_start", TZ, primary_key=True),
        sa.Column("count", sa.Integer, nullable=False),
    )
    op.add_column("pipelines", sa.Column("tenant", sa.Text, nullable=False, server_default="default"))
    op.create_index("pipelines_tenant_listing", "pipelines", ["tenant", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("pipelines_tenant_listing", "pipelines")
    op.drop_column("pipelines", "tenant")
    op.drop_table("api_key_windows")
    op.drop_table("api_keys")
