"""lyric service: the faults it injects while it runs, when its fault switch is on (tests and demos).

Revision ID: 0016
"""

from castad_runtime.stage import schema

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_injected_faults_v16()


def downgrade() -> None:
    schema.drop_injected_faults_v16()
