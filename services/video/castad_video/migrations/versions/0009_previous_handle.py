"""video service: the provider's handle of the last attempt whose work failed or was given up, kept so that
the next attempt looks that work up before it pays for new work.

Expand only: a service of the previous version neither keeps nor reads it (its attempts submit anew).

Revision ID: 0009
"""

from castad_runtime.stage import schema

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_previous_handle_v9()


def downgrade() -> None:
    schema.drop_previous_handle_v9()
