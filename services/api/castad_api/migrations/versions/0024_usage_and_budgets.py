"""api service: each tenant's weight in the stages' fair turns, its budgets, and what it used each day.

- `tenants`: an operator's settings of a tenant (its weight).
- `budgets`: a tenant's limits per UTC day or month (pipelines, seconds of song, estimated cost).
- `usage`: what each tenant used each UTC day, by meter, from the stages' events and the gateway's creations.

Expand only: tables a gateway of the previous release neither writes nor reads.

Revision ID: 0024
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("weight", sa.Integer, nullable=False, server_default="1"),
        sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("weight BETWEEN 1 AND 100", name="tenants_weight"),
    )
    op.create_table(
        "budgets",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("period", sa.Text, primary_key=True),
        sa.Column("pipelines", sa.Integer),
        sa.Column("song_seconds", sa.Float),
        sa.Column("cost", sa.Float),
        sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "usage",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("meter", sa.Text, primary_key=True),
        sa.Column("shard", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("amount", sa.Float, nullable=False),
    )
    op.create_index("usage_by_day", "usage", ["day"])


def downgrade() -> None:
    op.drop_index("usage_by_day", "usage")
    op.drop_table("usage")
    op.drop_table("budgets")
    op.drop_table("tenants")
