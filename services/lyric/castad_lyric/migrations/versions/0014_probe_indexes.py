"""lyric service: indexes of the jobs a claim takes and of those the prober polls (castad_runtime.stage.probes).

Expand only: a service of the previous version claims by the index jobs_due, as before.

Revision ID: 0014
"""

from castad_runtime.stage import schema

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_probe_indexes_v14()


def downgrade() -> None:
    schema.drop_probe_indexes_v14()
