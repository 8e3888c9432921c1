"""api service: every attempt with its worker, the time of each timeline entry, a pipeline's trace id, and
the indexes of the operator's statistics and of the search by customer name.

Expand only. The indexes on tables that may already be large are built first, CONCURRENTLY and
outside the migration's transaction, so that the gateway still running keeps writing meanwhile; a
build that failed half-way leaves an invalid index, dropped and built again when this runs again.
The rest is one transaction with the revision's stamp. Rows written before this revision have no
attempts, entry times (the time the gateway wrote them stands in) or trace ids.

Revision ID: 0007
"""

from collections.abc import Sequence
from typing import TypedDict

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
OPEN_ENDED = "('SUCCEEDED', 'FAILED', 'CANCELED')"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        for name, table, columns, options in _CONCURRENT_INDEXES:
            invalid = op.get_bind().execute(
                sa.text("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"), {"name": name}
            )
            if invalid.scalar():
                op.drop_index(name, table, postgresql_concurrently=True)
            op.create_index(name, table, columns, postgresql_concurrently=True, if_not_exists=True, **options)
    op.add_column("pipelines", sa.Column("trace_id", sa.Text))
    op.add_column("pipeline_stages", sa.Column("first_started_at", TZ))
    op.add_column("pipeline_events", sa.Column("occurred_at", TZ))
    op.create_table(
        "pipeline_attempts",
        sa.Column(
            "pipeline_id", pg.UUID(as_uuid=True), sa.ForeignKey("pipelines.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("stage", sa.Text, primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("worker", sa.Text),
        sa.Column("started_at", TZ),
        sa.Column("ended_at", TZ),
        sa.Column("outcome", sa.Text),
        sa.Column("error_code", sa.Text),
        sa.Column("error_message", sa.Text),
    )
    op.create_index(
        "pipeline_attempts_ended",
        "pipeline_attempts",
        ["ended_at"],
        postgresql_include=["stage", "outcome", "error_code", "started_at"],
        postgresql_where=sa.text("ended_at IS NOT NULL"),
    )


class _IndexOptions(TypedDict, total=False):
    """The PostgreSQL options of create_index these indexes take."""

    postgresql_where: sa.TextClause
    postgresql_using: str
    postgresql_ops: dict[str, str]


# Each index: its name, its table, its columns or expressions, and its options.
_CONCURRENT_INDEXES: tuple[tuple[str, str, Sequence[str | sa.TextClause], _IndexOptions], ...] = (
    ("pipelines_in_flight", "pipelines", ["status"], {"postgresql_where": sa.text(f"status NOT IN {OPEN_ENDED}")}),
    (
        "pipelines_customer_name",
        "pipelines",
        [sa.text("(brief ->> 'customer_name')")],
        {"postgresql_using": "gin", "postgresql_ops": {"(brief ->> 'customer_name')": "gin_trgm_ops"}},
    ),
    (
        "pipeline_stages_finished",
        "pipeline_stages",
        ["finished_at"],
        {"postgresql_where": sa.text("finished_at IS NOT NULL")},
    ),
    ("dead_letters_open", "dead_letters", ["kind"], {"postgresql_where": sa.text("status = 'dead'")}),
    ("dead_letters_received", "dead_letters", ["received_at"], {}),
)


def downgrade() -> None:
    op.drop_table("pipeline_attempts")
    op.drop_column("pipeline_events", "occurred_at")
    op.drop_column("pipeline_stages", "first_started_at")
    op.drop_column("pipelines", "trace_id")
    for name, table, _, _ in reversed(_CONCURRENT_INDEXES):
        op.drop_index(name, table)
    # pg_trgm stays: something else in the database may use it.
