"""At-least-once delivery, exactly-once effect: an event the relay already published, published again."""

from __future__ import annotations

import json

import pika
import pytest
from castad_contracts import envelope as envelope_
from castad_contracts import topology
from castad_testkit import briefs

pytestmark = pytest.mark.e2e


def _as_the_relay_publishes(row) -> tuple[bytes, pika.BasicProperties]:
    """Body and properties as castad_relay.relay.Publisher builds them from an outbox row."""
    env = dict(row["envelope"])
    headers = {k: env[k] for k in ("traceparent", "tracestate") if env.get(k)}
    properties = pika.BasicProperties(
        content_type=envelope_.CONTENT_TYPE,
        delivery_mode=2,
        message_id=str(row["event_id"]),
        type=row["routing_key"],
        timestamp=int(row["created_at"].timestamp()),
        headers=headers,
    )
    return json.dumps(env, separators=(",", ":")).encode(), properties


def _consumed(running, broker, queue: str, service: str) -> bool:
    """Stop the service gracefully; True if it had acknowledged everything in its queue.

    Dramatiq acknowledges a message only after its handler returned, and a stopping worker
    hands back what it had not handled yet, so an empty queue after the stop proves that
    every message was handled. (Handler errors would re-enqueue it to the delay queue.)
    """
    running.services.stop(service)
    return all(broker.ready(name) == 0 for name in (queue, f"{queue}.DQ"))


@pytest.mark.timeout(120)
def test_an_event_published_twice_has_one_effect(shared):
    running, dbs, broker = shared, shared.dbs, shared.broker
    pipeline_id = running.submit(briefs.sample())
    assert running.wait_terminal([pipeline_id])[pipeline_id].status == "SUCCEEDED"
    running.wait_until("every outbox row published", lambda: dbs.unpublished([pipeline_id]) == {})

    # Every stage event of the pipeline has been projected by the gateway: nothing of it is in flight.
    stage_events = {r["event_id"] for service in topology.STAGES for r in dbs.outbox_of(service, pipeline_id)}
    running.wait_until(
        "every stage event projected",
        lambda: {r["event_id"] for r in dbs.inbox_of("api", pipeline_id)} == stage_events,
    )
    events_before = running.events(pipeline_id)
    status_before = running.client.status(pipeline_id)

    # The two consumers of lyric.completed (song, and the gateway's projection) are stopped, so the
    # duplicate provably waits in their queues, then provably gets handled once they are back.
    song_queue, api_queue = broker.topology.queue("song"), broker.topology.queue("api")
    running.services.stop("song")
    running.services.stop("api")
    assert broker.ready(song_queue) == 0 and broker.ready(api_queue) == 0

    (job_before,) = dbs.jobs_of("song", [pipeline_id])
    attempts_before = dbs.attempts_of("song", job_before["id"])
    song_outbox_before = dbs.outbox_of("song", pipeline_id)
    timeline_before = dbs.timeline_of(pipeline_id)
    song_inbox_before = dbs.inbox_of("song", pipeline_id)
    api_inbox_before = dbs.inbox_of("api", pipeline_id)
    (completed,) = [r for r in dbs.outbox_of("lyric", pipeline_id) if r["routing_key"] == "lyric.completed"]
    assert completed["published_at"] is not None
    assert completed["event_id"] in {r["event_id"] for r in song_inbox_before}

    body, properties = _as_the_relay_publishes(completed)
    broker.publish("lyric.completed", body, properties)
    assert broker.ready(song_queue) == 1
    assert broker.ready(api_queue) == 1

    running.services.start("song")
    running.services.start("api")
    running.services.wait_ready(running.base_url)
    for queue in (song_queue, api_queue):
        running.wait_until(f"{queue} drained", lambda q=queue: broker.ready(q) == 0)
    assert _consumed(running, broker, song_queue, "song")
    assert _consumed(running, broker, api_queue, "api")
    assert broker.ready(broker.topology.dead_letter_queue) == 0
    letters = dbs.dead_letters.select().where(dbs.dead_letters.c.pipeline_id == pipeline_id)
    assert dbs.rows("api", letters) == []  # none recorded by the gateway either

    # Song: still one job with the same attempts, no second song.completed, the event seen once.
    (job_after,) = dbs.jobs_of("song", [pipeline_id])
    assert dict(job_after) == dict(job_before)
    assert dbs.attempts_of("song", job_after["id"]) == attempts_before
    song_outbox_after = dbs.outbox_of("song", pipeline_id)
    assert song_outbox_after == song_outbox_before
    assert [r["routing_key"] for r in song_outbox_after].count("song.completed") == 1
    assert dbs.inbox_of("song", pipeline_id) == song_inbox_before
    assert dbs.inbox_of("api", pipeline_id) == api_inbox_before
    assert len(dbs.jobs_of("video", [pipeline_id])) == 1

    # Gateway: the same timeline and status, once it serves again.
    running.services.start("api")
    running.services.wait_ready(running.base_url)
    assert dbs.timeline_of(pipeline_id) == timeline_before
    assert running.events(pipeline_id) == events_before
    assert running.client.status(pipeline_id) == status_before
