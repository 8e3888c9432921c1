"""The clustered engines of the fault harness (bench/faults/rabbitmq.py, bench/faults/postgres.py) losing a node.

RabbitMQ: a quorum queue keeps every message it confirmed through kill -9 of the node that leads
it, and a consumer on another node gets them; a node that was killed or stopped comes back into
the cluster. PostgreSQL: a commit on the primary is on its synchronous standby when it returns;
after kill -9 of the primary and a promotion, a client with the multi-host URL reaches the new
primary, finds the row and writes; the old primary, rebuilt, is the new one's synchronous standby.

One cluster and one pair per module, started from Debian's packages beside the system's servers.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pika
import pika.exceptions
import psycopg
import pytest
import sqlalchemy as sa
from castad_local import privileges

from bench import common
from bench.faults import engines, rabbitmq
from bench.faults import postgres as postgres_
from tests.support import waits

pytestmark = pytest.mark.integration

QUEUE = "cluster-test"
MESSAGES = [f"confirmed {i}".encode() for i in range(20)]


def _engines_present() -> None:
    """A failure, never a skip: `make setup` installs the packages."""
    if absent := engines.missing():
        pytest.fail(f"missing {', '.join(absent)}: {engines.HOW}")


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rabbitmq.RabbitCluster]:
    _engines_present()
    engines = rabbitmq.RabbitCluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield engines.start()
    finally:
        engines.destroy()


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[postgres_.PostgresPair]:
    _engines_present()
    pair = postgres_.PostgresPair(tmp_path_factory.mktemp("cluster"))
    try:
        yield pair.start()
    finally:
        pair.destroy()


@contextlib.contextmanager
def channel_to(url: str) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


def running_nodes(rabbit: rabbitmq.RabbitCluster) -> set[str]:
    return set(json.loads(rabbit.rabbitmqctl("cluster_status", "--formatter", "json"))["running_nodes"])


def test_a_quorum_queue_keeps_its_confirmed_messages_through_kill_9_of_its_leader(
    rabbit: rabbitmq.RabbitCluster,
) -> None:
    with channel_to(rabbit.urls()[0]) as channel:
        channel.confirm_delivery()
        channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        for body in MESSAGES:  # each returns once confirmed, raises if not
            channel.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    leader = rabbit.leader_of(QUEUE)

    rabbit.kill(leader)

    assert rabbit.leader_of(QUEUE) != leader
    other = next(node.name for node in rabbit.nodes if node.name != leader)
    received = []
    with channel_to(rabbit.url(other)) as channel:
        for method, _, body in channel.consume(QUEUE, inactivity_timeout=10):
            if method is None:
                break
            channel.basic_ack(method.delivery_tag)
            received.append(body)
            if len(received) == len(MESSAGES):
                break
        channel.cancel()
    assert received == MESSAGES

    rabbit.start_node(leader)  # returns once it is back in the cluster and in the queue
    assert running_nodes(rabbit) == {node.name for node in rabbit.nodes}


def test_a_stopped_node_starts_again_in_the_cluster(rabbit: rabbitmq.RabbitCluster) -> None:
    node = rabbit.nodes[-1].name
    rabbit.stop(node)
    assert node not in running_nodes(rabbit)

    rabbit.start_node(node)

    assert running_nodes(rabbit) == {each.name for each in rabbit.nodes}


def test_the_services_broker_users_log_in_on_every_node_with_their_permissions(rabbit: rabbitmq.RabbitCluster) -> None:
    users = privileges.Users.new("clustertest")
    rabbit.grant(users, vhost="clustertest")

    relay = users.name(privileges.RELAY)
    for url in rabbit.urls(relay, users.passwords[privileges.RELAY], "clustertest"):
        with channel_to(url) as channel, pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare("clustertest.relay-may-not", durable=True)  # the relay only publishes
        assert refused.value.reply_code == 403


def test_a_commit_survives_kill_9_of_the_primary_and_the_promoted_standby_takes_writes(
    postgres: postgres_.PostgresPair,
) -> None:
    url = postgres.url("postgres")
    info = common.dsn(url)
    assert {
        key: value
        for key, value in psycopg.conninfo.conninfo_to_dict(info).items()
        if key in ("host", "port", "user", "dbname", "target_session_attrs")
    } == {
        "host": "127.0.0.1,127.0.0.1",
        "port": ",".join(str(node.port) for node in postgres.nodes),
        "user": "postgres",
        "dbname": "postgres",
        "target_session_attrs": "read-write",
    }
    first_primary, first_standby = postgres.primary_port(), postgres.standby_port()
    with psycopg.connect(info, autocommit=True) as conn:
        assert conn.info.port == first_primary
        conn.execute("CREATE TABLE facts (id int PRIMARY KEY, said text NOT NULL)")
        with conn.transaction():
            conn.execute("INSERT INTO facts VALUES (1, 'before the failover')")
            before_commit = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
    with psycopg.connect(_direct(first_standby), autocommit=True) as standby:
        # Synchronous: the commit returned after the standby had its WAL on disk; not yet replayed, maybe.
        received = standby.execute("SELECT pg_last_wal_receive_lsn() >= %s::pg_lsn", before_commit).fetchone()
        assert received == (True,)
        waits.until(lambda: standby.execute("SELECT count(*) FROM facts").fetchone() == (1,), what="row replayed")

    postgres.kill_primary()
    postgres.promote()

    with psycopg.connect(info, autocommit=True) as conn:
        assert conn.info.port == first_standby
        assert conn.execute("SELECT said FROM facts").fetchall() == [("before the failover",)]
        conn.execute("INSERT INTO facts VALUES (2, 'after the failover')")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)  # as the services take the URL
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO facts VALUES (3, 'through SQLAlchemy')"))
    finally:
        engine.dispose()

    postgres.rebuild_standby()

    assert postgres.standby_port() == first_primary
    with psycopg.connect(info, autocommit=True) as conn:
        replication = conn.execute("SELECT application_name, sync_state FROM pg_stat_replication").fetchall()
        assert replication == [(postgres.standby.name, "sync")]
        conn.execute("INSERT INTO facts VALUES (4, 'with the rebuilt standby')")
    with psycopg.connect(_direct(first_primary), autocommit=True) as standby:
        waits.until(lambda: standby.execute("SELECT count(*) FROM facts").fetchone() == (4,), what="rows replayed")


def _direct(port: int) -> str:
    return f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
