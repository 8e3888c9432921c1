"""video service: when the provider called back while a worker held the job (its next poll is due at once).

Revision ID: 0015
"""

from castad_runtime.stage import schema

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_called_back_v15()


def downgrade() -> None:
    schema.drop_called_back_v15()
