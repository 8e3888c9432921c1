"""Services start in any order: one that starts after its producers misses none of their events.

As docs/getting-started.md runs them (each service on its own, in the Procfile's order) on a broker where set-up
did not declare the whole topology: the song stage's queue comes only with the song service.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from castad_contracts import topology
from castad_testkit import briefs


@pytest.mark.timeout(120)
def test_a_stage_that_starts_after_its_producer_finished_gets_the_event_that_waited_for_it(shared):
    running, dbs = shared, shared.dbs
    topo = running.installation.topology
    running.services.stop("song")
    running.services.stop("relay")
    shared.broker.channel.queue_delete(topo.queue("song"))  # as if neither set-up nor the service had declared it
    running.services.start("relay")  # a relay that never saw the song stage's queue

    pipeline_id = running.submit(briefs.sample())

    def lyrics_written() -> list[sa.RowMapping]:
        return [row for row in dbs.outbox_of("lyric", pipeline_id) if row["routing_key"] == "lyric.completed"]

    [waiting] = running.wait_until("the lyrics written", lyrics_written)
    assert waiting["published_at"] is None and waiting["publish_attempts"] == 0  # held, not sent to the gateway alone
    # The gateway hears lyric.started (published before) in its own time, and nothing more while the song waits.
    running.wait_until(
        "the gateway sees the lyric stage run", lambda: running.client.status(pipeline_id).status == "RUNNING"
    )
    assert [row["published_at"] for row in lyrics_written()] == [None]
    running.services.start("song")  # declares its queue and binds it, as it does at every start

    view = running.wait_terminal([pipeline_id], timeout_s=90)[pipeline_id]

    assert view.status == "SUCCEEDED"
    assert {stage.stage.value: stage.attempts for stage in view.stages} == dict.fromkeys(topology.STAGES, 1)
    [sent] = lyrics_written()
    assert sent["publish_attempts"] == 0 and sent["parked_at"] is None
