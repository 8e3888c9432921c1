"""api service: each format of the video the brief asked for, kept with the video stage.

- `pipeline_stages.formats`: video.completed's `renders()` (each format's MP4, frame size and poster, the first the
  stage's own artifact), set with the video stage's artifact; null for every other stage, and for a video a gateway
  of the previous release recorded (its formats are then not listed).

Expand only: a nullable column without a default, added without rewriting the table. A gateway of the previous
release neither writes nor reads it.

Revision ID: 0021
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("pipeline_stages", sa.Column("formats", pg.JSONB))


def downgrade() -> None:
    op.drop_column("pipeline_stages", "formats")
