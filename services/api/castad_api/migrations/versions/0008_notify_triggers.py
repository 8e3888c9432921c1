"""api service: the outbox and the timeline NOTIFY their listeners themselves, inside the writing transaction.

The outbox wakes the relay (one notification per transaction), a new timeline entry wakes the event
streams of its pipeline and the firehose (the pipeline's id as payload). Expand only: a gateway of the
previous version still sends its own NOTIFY after the commit, which only wakes a listener once more.

Revision ID: 0008
"""

from alembic import op
from castad_runtime import db, migration_ops

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

CHANNEL = "castad_pipeline_events"  # castad_api.repository.PIPELINE_EVENTS_CHANNEL, as it was at this revision


def upgrade() -> None:
    migration_ops.add_outbox_notify_v6(db.OUTBOX_CHANNEL)
    op.execute(
        "CREATE FUNCTION castad_timeline_notify() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN PERFORM pg_notify('{CHANNEL}', NEW.pipeline_id::text); RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER pipeline_events_notify AFTER INSERT ON pipeline_events"
        " FOR EACH ROW EXECUTE FUNCTION castad_timeline_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS pipeline_events_notify ON pipeline_events")
    op.execute("DROP FUNCTION IF EXISTS castad_timeline_notify()")
    migration_ops.drop_outbox_notify_v6()
