"""The gateway's projection on a real PostgreSQL, where two events of one pipeline meet."""

from __future__ import annotations

import threading
import uuid

import pytest
import sqlalchemy as sa
from castad_api import tables
from castad_contracts import events

from tests.integration.gateway import Projection, ago
from tests.support import waits

pytestmark = pytest.mark.integration

LYRIC, SONG, VIDEO = events.STAGE_ORDER


def test_events_that_waited_for_the_same_pipeline_each_see_what_the_other_committed(gateway: Projection):
    """Two stages end while a third transaction holds the pipeline.

    Each projection, once it has the lock, sees the stage the other one wrote, so the pipeline ends SUCCEEDED (a
    projection that read the stages with the lock it waited for would see them as they were before and leave it
    RUNNING).
    """
    pipeline_id = gateway.create()
    for stage in (LYRIC, SONG, VIDEO):
        gateway.event(pipeline_id, stage, "started", 1, ago(seconds=3))
    gateway.event(pipeline_id, LYRIC, "completed", 1, ago(seconds=2))

    holder = gateway.engine.connect()
    holder.begin()
    holder.execute(
        sa.select(tables.pipelines.c.id).where(tables.pipelines.c.id == uuid.UUID(pipeline_id)).with_for_update()
    )
    ends = [
        threading.Thread(target=gateway.event, args=(pipeline_id, stage, "completed", 1, ago(seconds=1)))
        for stage in (SONG, VIDEO)
    ]
    for end in ends:
        end.start()

    def waiting_for_the_lock() -> bool:
        with gateway.engine.connect() as conn:
            waiting = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        return waiting == 2

    waits.until(waiting_for_the_lock, what="both projections waiting for the pipeline")
    holder.commit()
    holder.close()
    for end in ends:
        end.join(10)

    with gateway.engine.connect() as conn:
        status, progress = conn.execute(
            sa.select(tables.pipelines.c.status, tables.pipelines.c.progress).where(
                tables.pipelines.c.id == uuid.UUID(pipeline_id)
            )
        ).one()
    assert (status, progress) == ("SUCCEEDED", 100)
