"""api service: the song's sung lines, kept with its stage, so that the gateway serves them as caption files.

- `pipeline_stages.sung_lines`: song.completed's `timed_lines` (each line and syllable with when it is sung), set
  with the song stage's artifact; null for every other stage, and for a song a gateway of the previous release
  recorded (its caption files are then not found).

Expand only: a nullable column without a default, added without rewriting the table. A gateway of the previous
release neither writes nor reads it.

Revision ID: 0020
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("pipeline_stages", sa.Column("sung_lines", pg.JSONB))


def downgrade() -> None:
    op.drop_column("pipeline_stages", "sung_lines")
