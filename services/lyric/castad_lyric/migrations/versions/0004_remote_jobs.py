"""lyric service: work submitted to a provider waits without a worker (AWAITING, polled); provider quotas.

Revision ID: 0004
"""

from castad_runtime.stage import schema

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_remote_jobs_v4()


def downgrade() -> None:
    schema.drop_remote_jobs_v4()
