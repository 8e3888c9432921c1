"""api service: `pipeline_stages.fetched_photos`, the photos named by URL that a stage fetched and kept.

video.completed v5 tells them (events.FetchedPhoto, by reference); the gateway lists them with the stage's
file and serves them as it serves that file. Expand only: a nullable column without a default, added
without rewriting the table. A gateway of the previous version neither writes nor reads it; a v5 event it
is handed it holds, by its version number, until its own upgrade.

Revision ID: 0016
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("pipeline_stages", sa.Column("fetched_photos", pg.JSONB))


def downgrade() -> None:
    op.drop_column("pipeline_stages", "fetched_photos")
