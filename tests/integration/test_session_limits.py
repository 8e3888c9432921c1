"""Nothing frozen holds the rest: what PostgreSQL ends in every session of a service (db.SessionLimits).

A process frozen inside a transaction (a paused VM, SIGSTOP between two statements) is, to PostgreSQL, a session
idle in a transaction that keeps its row locks. `idle_in_transaction_session_timeout` ends it, so that the work it
held goes on; `lock_timeout` ends a wait for a lock, as an outage (tried again, nothing counted).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping

import pytest
import sqlalchemy as sa
from castad_runtime import db, outages, tables

from tests.integration.helpers import stage_runner as make_runner
from tests.integration.helpers import succeed
from tests.integration.test_stage_runner import add_job

pytestmark = pytest.mark.integration


@pytest.fixture
def limited(installation) -> Iterator[Mapping[str, sa.Engine]]:
    """The lyric database through pools limited as a stage's are, only shorter: 1 s idle in a transaction, and a
    long one with 0.5 s of lock wait."""
    url = installation.database_urls["lyric"]
    made = {
        "idle": db.make_engine(url, 4, db.SessionLimits(idle_in_transaction_s=1.0, lock_wait_s=60.0)),
        "lock": db.make_engine(url, 4, db.SessionLimits(idle_in_transaction_s=60.0, lock_wait_s=0.5)),
    }
    try:
        yield made
    finally:
        for engine in made.values():
            engine.dispose()


def frozen(engine: sa.Engine) -> sa.Connection:
    """A session of the stage's own that locked every in-flight count (rows every claim updates) and said nothing."""
    conn = engine.connect()
    conn.begin()
    conn.execute(sa.select(tables.in_flight_counts).with_for_update()).all()
    return conn


def test_a_session_frozen_inside_a_transaction_on_shared_rows_holds_the_stages_claims_only_until_its_timeout(
    limited,
):
    stage = make_runner(limited["idle"], succeed)
    add_job(stage)
    holder = frozen(limited["idle"])
    claimed: list[object] = []
    claiming = threading.Thread(target=lambda: claimed.append(stage.claim_next()), daemon=True)

    started = time.monotonic()
    claiming.start()
    claiming.join(timeout=15)

    assert not claiming.is_alive(), "the claim still waits on the frozen session's locks"
    assert claimed and claimed[0] is not None and time.monotonic() - started < 15
    with pytest.raises(sa.exc.DBAPIError) as ended:  # the frozen process wakes to a session PostgreSQL ended
        holder.execute(sa.text("SELECT 1"))
    assert outages.is_outage(ended.value)  # so what it was doing is not the work's failure
    holder.close()


def frozen_after_a_pipelined_batch(engine: sa.Engine) -> sa.Connection:
    """As `frozen`, the counts locked in a pipelined batch that read a result midway, as the inbox's do.

    PostgreSQL's own idle_in_transaction_session_timeout then often leaves the session alone (PostgreSQL 15, psycopg
    3.2), not always.
    """
    conn = engine.connect()
    conn.begin()
    with db.pipelined(conn):
        db.run(conn, "SELECT 1 FROM in_flight_counts FOR UPDATE")
        db.run(conn, "SELECT 1").fetchone()
        db.run(conn, "SELECT 2")
    return conn


def test_a_session_frozen_after_a_pipelined_batch_is_ended_by_the_services_own_look_within_its_limit(limited):
    stage = make_runner(limited["idle"], succeed)
    add_job(stage)
    # Its own session limit is a minute: what ends it is the look (PostgreSQL's timeout misses such a session often,
    # not always, so a session limited as the look is might be ended either way).
    holder = frozen_after_a_pipelined_batch(limited["lock"])
    time.sleep(1.5)  # silent longer than the look's limit
    with limited["idle"].connect() as look:
        pid = holder.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
        state = look.execute(sa.text("SELECT state FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}).scalar()
    assert state == "idle in transaction"
    stuck = db.StuckSessions(limited["idle"], 1.0)
    claimed: list[object] = []
    claiming = threading.Thread(target=lambda: claimed.append(stage.claim_next()), daemon=True)

    started = time.monotonic()
    stuck.start()
    claiming.start()
    claiming.join(timeout=15)
    stuck.stop()

    assert not claiming.is_alive(), "the claim still waits on the frozen session's locks"
    assert claimed and claimed[0] is not None and time.monotonic() - started < 5  # a quarter of the limit, a look
    with pytest.raises(sa.exc.DBAPIError) as ended:
        holder.execute(sa.text("SELECT 1"))
    assert outages.is_outage(ended.value)
    holder.close()


def test_the_look_ends_no_session_at_work(limited):
    """A statement at work (a long query inside a transaction) is no session stuck on its client."""
    busy = limited["idle"].connect()
    busy.begin()
    at_work = threading.Thread(target=lambda: busy.execute(sa.text("SELECT pg_sleep(2.5)")), daemon=True)
    at_work.start()
    time.sleep(2.0)

    assert db.StuckSessions(limited["idle"], 1.0).sweep() == 0

    at_work.join(5)
    busy.rollback()
    busy.close()


def test_a_wait_for_a_lock_ends_at_its_timeout_as_an_outage(limited):
    holder = frozen(limited["lock"])
    try:
        with pytest.raises(sa.exc.DBAPIError) as waited, db.transaction(limited["lock"]) as conn:
            conn.execute(sa.select(tables.in_flight_counts).with_for_update()).all()
    finally:
        holder.close()

    assert waited.value.orig.sqlstate == "55P03" and outages.is_outage(waited.value)


def test_a_statement_past_the_services_limit_is_ended_as_its_own_failure(installation):
    """A bound for a statement gone wrong: ended, and not an outage (waiting it out would not make it quicker)."""
    limits = db.SessionLimits(idle_in_transaction_s=60.0, lock_wait_s=60.0, statement_s=0.3)
    engine = db.make_engine(installation.database_urls["lyric"], 1, limits)
    try:
        with pytest.raises(sa.exc.DBAPIError) as ended, engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_sleep(5)"))
        assert "statement timeout" in str(ended.value) and not outages.is_outage(ended.value)
        with engine.connect() as conn:  # the session goes on
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()
