"""api service: an image's file is kept, and deleted, outside the transactions that record it.

- `images.keeping_since`: set while the upload that recorded the image keeps its file (a row of the previous
  release, kept inside its transaction, has none); the image is not found until its file is kept.
- `images.deleting_since`: set once retention chose to delete the image; its file goes next, then its row. Such an
  image is not found, and a brief may not name it.

Neither the store's put nor its delete holds a transaction open any more: a slow bucket holds no row lock. Expand
only: nullable columns without a default, added without rewriting the table. A gateway of the previous release
writes neither (its images are kept, not being deleted) and reads neither, so it would record an upload of, or
create a pipeline naming, an image a new replica's retention is deleting: the CHANGELOG says how to keep that
retention still during the rollout.

Revision ID: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("images", sa.Column("keeping_since", TZ))
    op.add_column("images", sa.Column("deleting_since", TZ))


def downgrade() -> None:
    op.drop_column("images", "deleting_since")
    op.drop_column("images", "keeping_since")
