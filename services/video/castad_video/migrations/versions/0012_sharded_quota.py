"""video service: a provider's token bucket split into rows, and its jobs in flight counted by triggers.

No claim locks a row every other claim needs, and none counts the jobs table under it (issue 37).
Expand only: a service of the previous version goes on with the one bucket of quotas.tokens, which this
version no longer reads (during the upgrade the two versions' rates add up), and its jobs' changes of status
are counted by the triggers like this version's.

Revision ID: 0012
"""

from castad_runtime.stage import schema

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema.add_sharded_quota_v12()


def downgrade() -> None:
    schema.drop_sharded_quota_v12()
