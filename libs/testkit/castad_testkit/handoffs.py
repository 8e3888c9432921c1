"""The handoffs a pipeline's events make, and the clock that times each event's commit.

The benchmark and the fault harness measure a handoff from the commit of the event that leaves one database to the
handler that takes it in the next; PostgreSQL's clock_timestamp() and Python's time.time() are both this host's
CLOCK_REALTIME.
"""

from __future__ import annotations

from castad_contracts import events, topology

# The chain of a pipeline: (event type, producing database, consuming database), each stage's trigger as the
# contracts say it, then the last stage's result back to the gateway.
_LAST = events.stage_event(events.STAGE_ORDER[-1], "completed")
CHAIN = (
    *((trigger, topology.PRODUCERS[trigger], stage.value) for stage, trigger in events.TRIGGERS.items()),
    (_LAST, topology.PRODUCERS[_LAST], topology.GATEWAY),
)

# A deferred constraint trigger on an outbox records clock_timestamp() per row when the writing transaction commits
# (deferred triggers fire at COMMIT, before the commit's WAL flush); outbox.created_at is the transaction's start.
COMMIT_CLOCK = """
CREATE TABLE IF NOT EXISTS bench_commit (event_id uuid PRIMARY KEY, committed_at timestamptz NOT NULL);
CREATE OR REPLACE FUNCTION bench_commit_time() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_commit VALUES (NEW.event_id, clock_timestamp());
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER bench_commit_time AFTER INSERT ON outbox
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION bench_commit_time();
"""
COMMIT_CLOCK_OFF = "DROP TRIGGER IF EXISTS bench_commit_time ON outbox; DROP FUNCTION IF EXISTS bench_commit_time();"
