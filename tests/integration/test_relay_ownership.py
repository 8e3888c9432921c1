"""The relay publishes from each service's outbox only what that service may say.

Its own event types, written with its own source, to the events exchange; only the gateway's outbox addresses one
queue (a replayed dead letter). Any other row is parked at once with the reason, the operators are told (a notice
in the dead-letter queue), it is counted, and it holds back only the later rows of its own pipeline.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from castad_contracts import envelope, events, topology
from castad_relay import metrics as relay_metrics
from castad_runtime import db, metrics, outbox, tables
from psycopg import sql
from sqlalchemy.engine import make_url

from tests.integration.helpers import lyric_started, requested_envelope, write_events
from tests.support import servers, waits

pytestmark = pytest.mark.integration

SONG_STARTED = events.stage_event(events.Stage.SONG, "started")


def forge(
    engine: sa.Engine, env: envelope.Envelope, routing_key: str | None = None, destination: str | None = None
) -> None:
    """A row as whoever can write the database may write it: any envelope, routing key and destination."""
    with db.transaction(engine) as conn:
        db.run(conn, outbox.APPEND, (env.id, env.subject, routing_key or env.type, env.model_dump_json(), destination))


def row_of(engine: sa.Engine, event_id: uuid.UUID) -> sa.RowMapping:
    with engine.connect() as conn:
        return conn.execute(sa.select(tables.outbox).where(tables.outbox.c.event_id == event_id)).mappings().one()


def started(stage: events.Stage, pipeline_id: str, attempt: int = 1, source: str | None = None) -> envelope.Envelope:
    event_type = events.stage_event(stage, "started")
    return envelope.wrap(
        lyric_started(pipeline_id, attempt, stage), event_type, source or topology.SOURCES[stage.value]
    )


@pytest.mark.parametrize(
    ("service", "forged", "routing_key", "destination", "refusal"),
    [
        # another service's event type, with that service's source, as it would be if it were genuine
        ("song", lambda p: started(events.Stage.LYRIC, p), None, None, "lyric.started is lyric's, not song's"),
        ("song", lambda p: requested_envelope(p), None, None, "pipeline.requested is api's, not song's"),
        # its own type, but saying it comes from another service
        ("song", lambda p: started(events.Stage.SONG, p, source="/castad/lyric"), None, None, "source '/castad/lyric'"),
        # its own type as the routing key, another type inside
        ("song", lambda p: started(events.Stage.LYRIC, p), SONG_STARTED, None, "routing key song.started"),
        # a type no service produces
        ("api", lambda p: started(events.Stage.LYRIC, p).model_copy(update={"type": "pipeline.exploded"}), None, None,
         "no event type"),
        # a replay to one queue from another outbox than the gateway's
        ("lyric", lambda p: requested_envelope(p), None, "song", "only the gateway's outbox addresses a queue"),
    ],
    ids=["another-services-type", "the-gateways-type", "another-source", "type-not-routing-key", "unknown-type",
         "replay-not-from-the-gateway"],
)  # fmt: skip
def test_a_row_its_service_may_not_publish_is_parked_at_once_with_the_reason_and_holds_back_only_its_pipeline(
    installation, engines, amqp, start_relay, service, forged, routing_key, destination, refusal
):
    topo = installation.topology
    engine = engines[service]
    registry = metrics.registry()
    victim, other = str(uuid.uuid4()), str(uuid.uuid4())
    env = forged(victim)
    forge(engine, env, routing_key, topo.queue(destination) if destination else None)
    later = own_rows(engine, service, victim)
    free = own_rows(engine, service, other)
    start_relay(metrics=relay_metrics.RelayMetrics(registry), fallback_poll_s=30, max_publish_attempts=10)

    parked = waits.until(lambda: row_of(engine, env.id)["parked_at"], what="the forged row parked")
    waits.until(lambda: all(row_of(engine, e)["published_at"] for e in free), what="another pipeline's rows published")

    row = row_of(engine, env.id)
    assert refusal in row["last_error"] and row["published_at"] is None and parked
    assert row["publish_attempts"] == 1  # parked at once: trying again would change nothing
    assert all(row_of(engine, e)["published_at"] is None for e in later)  # its pipeline waits behind it
    delivered = [message for queue in topo.services for message in amqp.take_all(topo.queue(queue))]
    assert env.id not in {uuid.UUID(message.document["id"]) for message in delivered}
    [notice] = amqp.take(topo.dead_letter_queue, 1)
    assert notice.headers["x-castad-parked-event"] == str(env.id) and refusal in notice.headers["x-castad-reason"]
    labels = {"source": service, "reason": relay_metrics.FORBIDDEN}
    assert registry.get_sample_value("castad_relay_publish_failures_total", labels) == 1


def own_rows(engine: sa.Engine, service: str, pipeline_id: str) -> list[uuid.UUID]:
    """A row `service` may publish, about `pipeline_id`."""
    if service == "api":
        return [
            env.id
            for env in write_events(engine, [requested_envelope(pipeline_id).payload()], events.PIPELINE_REQUESTED)
        ]
    stage = events.Stage(service)
    return [
        env.id
        for env in write_events(engine, [lyric_started(pipeline_id, 2, stage)], events.stage_event(stage, "started"))
    ]


def test_the_gateways_replay_keeps_its_producers_source_and_goes_to_its_queue_alone(
    installation, engines, amqp, start_relay
):
    """A dead letter the gateway sends back.

    An event another service produced, in the gateway's outbox, addressed to the queue it came from. It is
    published there alone, as it was.
    """
    topo = installation.topology
    completed = started(events.Stage.LYRIC, str(uuid.uuid4()))
    with db.transaction(engines["api"]) as conn:
        outbox.append(conn, completed, destination=topo.queue("song"), delivery_id=uuid.uuid4())
    start_relay(fallback_poll_s=30)

    [replayed] = amqp.take(topo.queue("song"), 1)

    assert replayed.document["source"] == "/castad/lyric" and replayed.event_id == completed.id
    assert amqp.take_all(topo.queue("api")) == []


@pytest.fixture
def lyric_owner(installation, engines) -> Iterator[str]:
    """The lyric database as its service's role holds it (owner of the database and of its public schema): its URL."""
    role = f"owner_{uuid.uuid4().hex[:10]}"
    url = make_url(installation.database_urls["lyric"])
    database = url.database
    with psycopg.connect(**db.connect_kwargs(servers.PG_URL), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), role))
        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(database), sql.Identifier(role)))
    with db.transaction(engines["lyric"]) as conn:
        conn.execute(sa.text(f'ALTER SCHEMA public OWNER TO "{role}"'))
    try:
        yield url.set(username=role, password=role).render_as_string(hide_password=False)
    finally:
        engines.dispose()
        with psycopg.connect(**db.connect_kwargs(servers.database_url(database)), autocommit=True) as conn:
            conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(sql.Identifier(role)))
        with psycopg.connect(**db.connect_kwargs(servers.PG_URL), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# What the owner of a stage's database may do in it, with no right beyond its own, first on the database's search
# path, which every new session there takes (the relay's too, unless it sets its own): an operator `->>` that names
# the stage's own type and source whatever the envelope holds, and an `=` on text that is never true, so that no
# row of a pipeline would be held back behind an earlier one that is held (the relay's own order).
OWN_OPERATOR = """
CREATE SCHEMA mine;
CREATE FUNCTION mine.field(envelope jsonb, key text) RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog
AS $$ SELECT CASE key WHEN 'type' THEN 'lyric.started' WHEN 'source' THEN '/castad/lyric' ELSE envelope ->> key END $$;
CREATE OPERATOR mine.->> (LEFTARG = jsonb, RIGHTARG = text, FUNCTION = mine.field);
CREATE FUNCTION mine.never(a text, b text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT false $$;
CREATE OPERATOR mine.= (LEFTARG = text, RIGHTARG = text, FUNCTION = mine.never);
ALTER DATABASE {database} SET search_path = mine, pg_catalog, public;
"""


def test_a_stage_that_defines_its_own_operators_and_search_path_still_gets_only_its_own_events_published(
    installation, engines, amqp, start_relay, lyric_owner
):
    """The relay judges the bytes it publishes, read as stored: nothing the stage's database computes decides."""
    topo = installation.topology
    with psycopg.connect(**db.connect_kwargs(lyric_owner), autocommit=True) as conn:
        conn.execute(OWN_OPERATOR.format(database=sql.Identifier(db.database_name(lyric_owner)).as_string(conn)))
    with psycopg.connect(**db.connect_kwargs(lyric_owner), autocommit=True) as conn:  # a session begun since
        [seen] = conn.execute("SELECT '{\"type\": \"song.started\"}'::jsonb ->> 'type'").fetchone() or ("",)
    assert seen == "lyric.started"  # the owner's sessions see what it chose
    victim = str(uuid.uuid4())
    forged = started(events.Stage.SONG, victim)  # another stage's event, under the stage's own key
    forge(engines["lyric"], forged, routing_key=events.stage_event(events.Stage.LYRIC, "started"))
    later = own_rows(engines["lyric"], "lyric", victim)
    start_relay(fallback_poll_s=30, max_publish_attempts=10)

    waits.until(lambda: row_of(engines["lyric"], forged.id)["parked_at"], what="the forged row parked")
    free = own_rows(engines["lyric"], "lyric", str(uuid.uuid4()))  # a drain after the park, as in the run
    waits.until(lambda: all(row_of(engines["lyric"], e)["published_at"] for e in free), what="the free row published")
    assert all(row_of(engines["lyric"], e)["published_at"] is None for e in later)  # still behind the parked one

    assert (
        "routing key lyric.started is not its event's type 'song.started'"
        in row_of(engines["lyric"], forged.id)["last_error"]
    )
    delivered = [message for queue in topo.services for message in amqp.take_all(topo.queue(queue))]
    assert forged.id not in {uuid.UUID(message.document["id"]) for message in delivered}


def test_a_park_that_did_not_commit_tells_the_operators_again_under_the_same_id(
    installation, engines, amqp, start_relay
):
    """The notice of a park is named by the version of the row it parks.

    A park whose transaction does not commit (here it waits on a lock past its limit, as a relay's session ended
    inside that transaction would end) leaves the row as it was: told again, the notice has the same id, which the
    gateway records once. Republished and parked again, the row is a version of its own, with a notice of its own.
    """
    topo = installation.topology
    engine = engines["api"]
    env = started(events.Stage.LYRIC, str(uuid.uuid4())).model_copy(update={"type": "pipeline.exploded"})
    forge(engine, env)
    with engine.connect() as holder:  # its transaction holds the row's lock until it closes
        holder.execute(sa.select(tables.outbox.c.id).where(tables.outbox.c.event_id == env.id).with_for_update())
        start_relay(fallback_poll_s=30, db_lock_wait_s=0.2)
        told = amqp.take(topo.dead_letter_queue, 2, timeout=20)  # each park waited on the lock, and gave up
        assert row_of(engine, env.id)["parked_at"] is None
    waits.until(lambda: row_of(engine, env.id)["parked_at"], what="the row parked once the lock was let go")

    told += amqp.take_all(topo.dead_letter_queue)
    assert {notice.properties.message_id for notice in told} == {told[0].properties.message_id}
    with db.transaction(engine) as conn:
        assert outbox.republish(conn, [env.id]) == 1
    waits.until(lambda: row_of(engine, env.id)["parked_at"], what="the republished row parked again")
    [again] = amqp.take(topo.dead_letter_queue, 1)
    assert again.headers["x-castad-parked-event"] == str(env.id)
    assert again.properties.message_id != told[0].properties.message_id
