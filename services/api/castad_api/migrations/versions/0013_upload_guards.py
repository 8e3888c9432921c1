"""api service: what retention and the upload limits need of uploaded images.

- `images.uploaded_at`, an image's last upload (the migration's time for those uploaded before: a full retention
  period from the upgrade), and its index: retention
  deletes an image no pipeline names some time after it;
- `pipelines_photos`, the pipelines whose brief names photos by image id: whether one still names an image;
- `image_upload_buckets`, each tenant's uploads as a token bucket.

Expand only: a gateway of the previous version ignores all three (it records an upload again without moving
its `uploaded_at`, and does not lock the images a pipeline it creates names: during a rollout, only an image
retention would delete anyway, unnamed for CASTAD_API_RETENTION_IMAGES_S, could be named at that moment).
The index on pipelines, which may already be large, is built first, CONCURRENTLY and outside the migration's
transaction, as 0007 does; a build that failed half-way is dropped and built again.

Revision ID: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
PHOTOS_INDEX = "pipelines_photos"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        invalid = op.get_bind().execute(
            sa.text("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"), {"name": PHOTOS_INDEX}
        )
        if invalid.scalar():
            op.drop_index(PHOTOS_INDEX, "pipelines", postgresql_concurrently=True)
        op.create_index(
            PHOTOS_INDEX,
            "pipelines",
            [sa.text("(brief -> 'photos') jsonb_path_ops")],
            postgresql_using="gin",
            postgresql_where=sa.text("brief ? 'photos'"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
    op.add_column("images", sa.Column("uploaded_at", TZ, nullable=False, server_default=sa.func.now()))
    op.create_index("images_uploaded", "images", ["uploaded_at"])
    op.create_table(
        "image_upload_buckets",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("at", TZ, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("image_upload_buckets")
    op.drop_index("images_uploaded", "images")
    op.drop_column("images", "uploaded_at")
    op.drop_index(PHOTOS_INDEX, "pipelines")
