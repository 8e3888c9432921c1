"""api service: reviews of a pipeline's drafts, its deadline stopped while a draft waits, and remakes.

- `pipelines.review`: the review the request asked for (null: none).
- `pipelines.deadline_paused_at`: since when the deadline stands still (a draft waits for a decision); when the
  pipeline goes on, its deadline is moved on by as long.
- `pipelines.remake_of`, `remade_from`: the pipeline a remake remakes, and its first stage made again; indexed
  (`pipelines_remakes`) to list a pipeline's remakes.
- `pipeline_reviews`: each draft a stage made for a review (`lyric.drafted`), the decision a key made on it, or its
  timeout (`lyric.review_expired`).

Expand only: columns and a table a gateway of the previous release neither writes nor reads.

Revision ID: 0023
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("pipelines", sa.Column("review", pg.JSONB))
    op.add_column("pipelines", sa.Column("deadline_paused_at", TZ))
    op.add_column("pipelines", sa.Column("remake_of", pg.UUID(as_uuid=True)))
    op.add_column("pipelines", sa.Column("remade_from", sa.Text))
    op.create_index("pipelines_remakes", "pipelines", ["remake_of"], postgresql_where=sa.text("remake_of IS NOT NULL"))
    op.create_table(
        "pipeline_reviews",
        sa.Column("draft_id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column(
            "pipeline_id", pg.UUID(as_uuid=True), sa.ForeignKey("pipelines.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("stage", sa.Text, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("lyrics", pg.JSONB, nullable=False),
        sa.Column("review_until", TZ, nullable=False),
        sa.Column("on_timeout", sa.Text, nullable=False),
        sa.Column("drafted_at", TZ, nullable=False),
        sa.Column("decision", sa.Text),
        sa.Column("edited", pg.JSONB),
        sa.Column("note", sa.Text),
        sa.Column("decided_by", pg.UUID(as_uuid=True)),
        sa.Column("decided_at", TZ),
        sa.Column("expired_at", TZ),
    )
    op.create_index("pipeline_reviews_by_pipeline", "pipeline_reviews", ["pipeline_id", "round"])
    op.create_index(
        "pipeline_reviews_open", "pipeline_reviews", ["review_until"], postgresql_where=sa.text("decision IS NULL")
    )


def downgrade() -> None:
    op.drop_table("pipeline_reviews")
    op.drop_index("pipelines_remakes", "pipelines")
    op.drop_column("pipelines", "remade_from")
    op.drop_column("pipelines", "remake_of")
    op.drop_column("pipelines", "deadline_paused_at")
    op.drop_column("pipelines", "review")
