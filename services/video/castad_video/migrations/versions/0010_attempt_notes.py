"""video service: the provider's advisory warnings on an attempt's submitted work, kept on the attempt.

Expand only: a service of the previous version neither writes nor reads it.

Revision ID: 0010
"""

from castad_runtime.stage import schema

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_attempt_notes_v10()


def downgrade() -> None:
    schema.drop_attempt_notes_v10()
