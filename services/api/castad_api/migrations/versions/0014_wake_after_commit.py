"""api service: the outbox and the timeline no longer NOTIFY inside the writing transaction; the writer wakes
their listeners after it.

A notifying commit waits for every other one under a lock of the whole server (castad_runtime.wakeups).
Contract: a gateway of the previous version, still running during the upgrade, writes rows that wake no
listener; the relay finds them by its fallback poll (CASTAD_RELAY_FALLBACK_POLL_S) and the event streams
by their sweep (CASTAD_API_SSE_SWEEP_S), seconds later.

Revision ID: 0014
"""

from alembic import op
from castad_runtime import db, migration_ops

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

CHANNEL = "castad_pipeline_events"  # castad_api.repository.PIPELINE_EVENTS_CHANNEL, as it was at this revision


def upgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS pipeline_events_notify ON pipeline_events")
    op.execute("DROP FUNCTION IF EXISTS castad_timeline_notify()")
    migration_ops.drop_outbox_notify_v6()


def downgrade() -> None:
    migration_ops.add_outbox_notify_v6(db.OUTBOX_CHANNEL)
    op.execute(
        "CREATE FUNCTION castad_timeline_notify() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN PERFORM pg_notify('{CHANNEL}', NEW.pipeline_id::text); RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER pipeline_events_notify AFTER INSERT ON pipeline_events"
        " FOR EACH ROW EXECUTE FUNCTION castad_timeline_notify()"
    )
