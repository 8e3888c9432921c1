"""lyric service: work submitted to a provider waits without a worker (AWAITING, polled); provider quotas.

Revision ID: 0004
"""

from castad_runtime import migration_ops

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_remote_jobs_v4()


def downgrade() -> None:
    migration_ops.drop_remote_jobs_v4()
