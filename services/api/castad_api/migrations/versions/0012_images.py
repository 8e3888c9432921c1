"""api service: images a tenant uploaded, which its briefs name as photos.

Expand only: a gateway of the previous version ignores the table (and refuses a brief with photos, a
field it does not know).

Revision ID: 0012
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "images",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("sha256", sa.Text, nullable=False),
        sa.Column("media_type", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("width", sa.Integer, nullable=False),
        sa.Column("height", sa.Integer, nullable=False),
        sa.Column("uri", sa.Text, nullable=False),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("tenant", "sha256", name="images_tenant_sha256"),
    )


def downgrade() -> None:
    op.drop_table("images")
