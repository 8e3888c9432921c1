"""lyric service: the faults it injects while it runs, when its fault switch is on (tests and demos).

Revision ID: 0016
"""

from castad_runtime import migration_ops

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    migration_ops.add_injected_faults_v16()


def downgrade() -> None:
    migration_ops.drop_injected_faults_v16()
