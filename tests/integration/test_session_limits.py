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


def test_a_wait_for_a_lock_ends_at_its_timeout_as_an_outage(limited):
    holder = frozen(limited["lock"])
    try:
        with pytest.raises(sa.exc.DBAPIError) as waited, db.transaction(limited["lock"]) as conn:
            conn.execute(sa.select(tables.in_flight_counts).with_for_update()).all()
    finally:
        holder.close()

    assert waited.value.orig.sqlstate == "55P03" and outages.is_outage(waited.value)
