"""api service: the song's sung lines, served as caption files, and the video's poster, kept with their stages.

- `pipeline_stages.sung_lines`: song.completed's `timed_lines` (each line and syllable with when it is sung), set
  with the song stage's artifact; null for every other stage, and for a song a gateway of the previous release
  recorded (its caption files are then not found).
- `pipeline_stages.poster`: video.completed's `poster` (v8), a file of the video stage as its artifact is; null
  when the renderer made none, and for a video a gateway of the previous release recorded.

Expand only: nullable columns without a default, added without rewriting the table. A gateway of the previous
release neither writes nor reads them.

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
    op.add_column("pipeline_stages", sa.Column("poster", pg.JSONB))


def downgrade() -> None:
    op.drop_column("pipeline_stages", "poster")
    op.drop_column("pipeline_stages", "sung_lines")
