"""api service: each tenant's brand kit, and the pipelines whose brand shows a logo found by it.

- `brand_kits`: a row per tenant that set one (PUT /v1/brand): its logo (an image id), colours, font and caption
  style, when and by which key it was set.
- `pipelines_brand_logo`: pipelines by the image id of their brief's brand logo, so that image retention keeps a
  logo while a pipeline shows it, as it keeps photos (`pipelines_photos`).

Expand only: a table and an index a gateway of the previous release neither writes nor reads. The index on
pipelines, which may already be large, is built first, CONCURRENTLY and outside the migration's transaction, as
0013 does; a build that failed half-way is dropped and built again.

Revision ID: 0022
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

LOGO_INDEX = "pipelines_brand_logo"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        invalid = op.get_bind().execute(
            sa.text("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"), {"name": LOGO_INDEX}
        )
        if invalid.scalar():
            op.drop_index(LOGO_INDEX, "pipelines", postgresql_concurrently=True)
        op.create_index(
            LOGO_INDEX,
            "pipelines",
            [sa.text("(brief #>> '{brand,logo,id}')")],
            postgresql_where=sa.text("brief ? 'brand'"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
    op.create_table(
        "brand_kits",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("logo", pg.UUID(as_uuid=True)),
        sa.Column("colors", pg.JSONB, nullable=False),
        sa.Column("font", sa.Text),
        sa.Column("caption_style", pg.JSONB, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_by", pg.UUID(as_uuid=True)),
    )
    op.create_index("brand_kits_logo", "brand_kits", ["logo"], postgresql_where=sa.text("logo IS NOT NULL"))


def downgrade() -> None:
    op.drop_table("brand_kits")
    op.drop_index(LOGO_INDEX, "pipelines")
