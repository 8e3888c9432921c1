"""The clustered engines of the fault harness (castad_faults.rabbitmq, castad_faults.postgres) losing a node.

RabbitMQ: a quorum queue keeps every message it confirmed through kill -9 of the node that leads
it, and a consumer on another node gets them; a node that was killed or stopped comes back into
the cluster. PostgreSQL, a primary and two standbys whose clocks run ahead: a commit on the primary is on a
standby when it returns, and goes on while a standby is lost; after kill -9 of the primary and a promotion, a client
with the multi-host URL reaches the new primary (its clock ahead), finds the row and writes; the other standby
follows it, and the old primary, rebuilt, is a synchronous standby again.

One RabbitMQ cluster and one PostgreSQL cluster per module, started from Debian's packages beside the system's
servers.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

import pika
import pika.exceptions
import psycopg
import pytest
import sqlalchemy as sa
from castad_contracts import topology
from castad_faults import engines, rabbitmq
from castad_faults import postgres as postgres_
from castad_local import privileges
from castad_testkit import scratch

from tests.support import waits

pytestmark = pytest.mark.integration

QUEUE = "cluster-test"
MESSAGES = [f"confirmed {i}".encode() for i in range(20)]
CLOCK_AHEAD_S = 5.0


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
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[postgres_.PostgresCluster]:
    _engines_present()
    cluster = postgres_.PostgresCluster(tmp_path_factory.mktemp("cluster"), standbys=2, clock_ahead_s=CLOCK_AHEAD_S)
    try:
        yield cluster.start()
    finally:
        cluster.destroy()


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

    relay = users.name(topology.RELAY)
    for url in rabbit.urls(relay, users.passwords[topology.RELAY], "clustertest"):
        with channel_to(url) as channel, pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare("clustertest.relay-may-not", durable=True)  # the relay only publishes
        assert refused.value.reply_code == 403


def test_a_commit_goes_on_while_a_standby_is_lost_and_the_standby_catches_up_once_back(
    postgres: postgres_.PostgresCluster,
) -> None:
    info = scratch.dsn(postgres.url("postgres"))
    lost, other = postgres.standbys
    with psycopg.connect(info, autocommit=True) as conn:
        conn.execute("CREATE TABLE commits (id int PRIMARY KEY)")
        postgres.kill_standby(lost)
        with conn.transaction():
            conn.execute("SET LOCAL statement_timeout = '5s'")  # a commit waiting for the lost one fails the test
            conn.execute("INSERT INTO commits VALUES (1)")
        assert conn.execute("SELECT application_name FROM pg_stat_replication").fetchall() == [(other.name,)]

        postgres.start_standby(lost)

        with psycopg.connect(_direct(lost.port), autocommit=True) as standby:
            waits.until(lambda: standby.execute("SELECT count(*) FROM commits").fetchone() == (1,), what="caught up")


def test_a_commit_survives_kill_9_of_the_primary_and_the_promoted_standby_takes_writes(
    postgres: postgres_.PostgresCluster,
) -> None:
    url = postgres.url("postgres")
    info = scratch.dsn(url)
    assert {
        key: value
        for key, value in psycopg.conninfo.conninfo_to_dict(info).items()
        if key in ("host", "port", "user", "dbname", "target_session_attrs")
    } == {
        "host": "127.0.0.1,127.0.0.1,127.0.0.1",
        "port": ",".join(str(node.port) for node in postgres.nodes),
        "user": "postgres",
        "dbname": "postgres",
        "target_session_attrs": "read-write",
    }
    first_primary, standbys = postgres.primary_port(), [node.port for node in postgres.standbys]
    with psycopg.connect(info, autocommit=True) as conn:
        assert conn.info.port == first_primary
        assert conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall() == [("quorum",), ("quorum",)]
        conn.execute("CREATE TABLE facts (id int PRIMARY KEY, said text NOT NULL)")
        with conn.transaction():
            conn.execute("INSERT INTO facts VALUES (1, 'before the failover')")
            before_commit = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        primary_clock = _clock_ahead_s(conn)
    assert abs(primary_clock) < 1
    # Synchronous: the commit returned after a standby had its WAL on disk; not yet replayed, maybe.
    received = []
    for port in standbys:
        with psycopg.connect(_direct(port), autocommit=True) as standby:
            received += standby.execute("SELECT pg_last_wal_receive_lsn() >= %s::pg_lsn", before_commit).fetchone()
    assert True in received

    postgres.kill_primary()
    postgres.promote()

    with psycopg.connect(info, autocommit=True) as conn:
        assert conn.info.port in standbys
        assert abs(_clock_ahead_s(conn) - CLOCK_AHEAD_S) < 1  # the promoted standby's clock is ahead
        assert conn.execute("SELECT said FROM facts").fetchall() == [("before the failover",)]
        conn.execute("INSERT INTO facts VALUES (2, 'after the failover')")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)  # as the services take the URL
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO facts VALUES (3, 'through SQLAlchemy')"))
    finally:
        engine.dispose()
    [follower] = [port for port in standbys if port != postgres.primary_port()]
    with psycopg.connect(_direct(follower), autocommit=True) as standby:  # the other standby follows the new primary
        waits.until(lambda: standby.execute("SELECT count(*) FROM facts").fetchone() == (3,), what="rows followed")

    postgres.rebuild_standby()

    assert first_primary in {node.port for node in postgres.standbys}
    with psycopg.connect(info, autocommit=True) as conn:
        replication = conn.execute("SELECT application_name, sync_state FROM pg_stat_replication").fetchall()
        assert sorted(replication) == sorted((node.name, "quorum") for node in postgres.standbys)
        conn.execute("INSERT INTO facts VALUES (4, 'with the rebuilt standby')")
    with psycopg.connect(_direct(first_primary), autocommit=True) as standby:
        waits.until(lambda: standby.execute("SELECT count(*) FROM facts").fetchone() == (4,), what="rows replayed")


def _clock_ahead_s(conn: psycopg.Connection[tuple[object, ...]]) -> float:
    """How far a server's clock is ahead of this machine's."""
    before = time.time()
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0]) - (before + time.time()) / 2


def _direct(port: int) -> str:
    return f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
