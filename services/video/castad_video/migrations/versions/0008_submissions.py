"""video service: what was sent to a provider: each attempt's submission and its key; reopened jobs.

Expand only: a service of the previous version records no submissions and does not count reopens
(its attempts show no submission; an operator retry it applies keeps the keys of the run before).

Revision ID: 0008
"""

from castad_runtime.stage import schema

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_submissions_v8()


def downgrade() -> None:
    schema.drop_submissions_v8()
