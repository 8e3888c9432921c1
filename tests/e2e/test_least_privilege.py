"""Least privilege, end to end: each service as its own PostgreSQL role and RabbitMQ user.

The roles and users are made for the test's own namespace by the code set-up uses
(`castad_local.privileges`). With them, a pipeline and an operator's dead-letter replay still
work (a handler's delayed retry, a dead letter, a replay through the relay, the relay binding a
queue to what it takes); and each role and user is refused what is not its own: another service's
database, the relay anything but the outbox and binding queues to events, another service's
queue, the events exchange for anyone but the relay, the dead-letter exchange for anyone but the
relay and the gateway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pika
import pika.exceptions
import psycopg
import pytest
import sqlalchemy as sa
from castad_contracts import topology
from castad_local import privileges, stack
from castad_runtime import migrations
from castad_testkit import briefs
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from tests.e2e.test_operator import post
from tests.support import installation as installation_
from tests.support import servers
from tests.support.installation import Installation

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def installation(
    migrated_templates: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installation]:
    """One installation for the module (the `castad` of its first test runs on it too).

    Its roles and users take seconds to make and to drop, and the tests only read through them (the pipeline's
    test too: what it writes, it writes as the services always do).
    """
    with installation_.made(migrated_templates, tmp_path_factory.mktemp("privileges")) as made:
        yield made


@pytest.fixture(scope="module")
def users(installation: Installation) -> Iterator[privileges.Users]:
    made = privileges.Users.new(installation.namespace)
    try:
        privileges.grant(made, installation.database_urls, installation.amqp_url)
        yield made
    finally:
        for url in installation.database_urls.values():
            migrations.drop_database(url)  # a role that owns a database cannot be dropped
        privileges.drop_postgres(made, servers.PG_URL)
        privileges.drop_rabbitmq(made, installation.amqp_url)


def _plain(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.mark.timeout(240)
def test_each_service_as_its_own_user_runs_a_pipeline_a_retry_a_dead_letter_and_its_replay(
    installation, users, castad
):  # `users` before `castad`: the services stop before their roles go
    env = users.env(installation.database_urls, installation.amqp_url)
    ports = {service: stack.free_port() for service in ("relay", "lyric")}
    env |= {f"CASTAD_{service.upper()}_HEALTH_PORT": str(port) for service, port in ports.items()}
    running = castad({**env, "CASTAD_LYRIC_FAULT_HANDLER_RATE": "1", "CASTAD_HANDLER_RETRIES": "1"})
    # The song stage's queue unbound from lyric.completed, as if its service had not started yet: the pipeline
    # gets past the lyrics only because the relay, as its own user, binds it again before it publishes them.
    topo = installation.topology
    admin = pika.BlockingConnection(pika.URLParameters(installation.amqp_url))
    admin.channel().queue_unbind(topo.queue("song"), topo.exchange, "lyric.completed")
    admin.close()
    pipeline_id = running.submit(briefs.sample())

    def listed() -> list[dict[str, Any]]:
        return running.http.get("/v1/dead-letters", params={"pipeline_id": pipeline_id}).json()["items"]

    # Retried once through lyric's requeue exchange, then filed through the dead-letter exchange.
    [letter] = running.wait_until("the request dead-lettered and recorded", listed)
    assert "handler failed 2 times" in letter["reason"]
    running.services.stop("lyric")
    running.services.start("lyric", {"CASTAD_LYRIC_FAULT_HANDLER_RATE": "0"})
    assert post(running, f"/v1/dead-letters/{letter['id']}/replay").status_code == 202  # the relay sends it back
    assert running.wait_terminal([pipeline_id])[pipeline_id].status == "SUCCEEDED"
    # A scrape reads, as each service's own role and user, its jobs, every outbox (the relay), the dead
    # letters (the gateway) and its own queues.
    for url in (f"{running.base_url}/metrics", *(f"http://127.0.0.1:{port}/metrics" for port in ports.values())):
        families = text_string_to_metric_families(httpx.get(url, timeout=10).text)
        reads = {s.labels["part"]: s.value for f in families if f.name == "castad_scrape_success" for s in f.samples}
        assert reads and set(reads.values()) == {1.0}, (url, reads)

    databases = {make_url(url).database: service for service, url in installation.database_urls.items()}
    admin = sa.create_engine(servers.database_url("postgres"))
    with admin.connect() as conn:
        sessions = conn.execute(
            sa.text("SELECT datname, usename FROM pg_stat_activity WHERE datname = ANY(:names)"),
            {"names": list(databases)},
        ).all()
    admin.dispose()
    for database, service in databases.items():
        connected = {user for name, user in sessions if name == database}
        assert users.name(service) in connected and users.name("relay") in connected
        assert connected <= {users.name(service), users.name("relay")}, (database, connected)
    listed_connections = subprocess.run(
        ["rabbitmqctl", "--quiet", "list_connections", "user", "--formatter", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    broker_users = {row["user"] for row in json.loads(listed_connections.stdout)}
    assert {users.name(service) for service in privileges.USERS} <= broker_users


def test_no_role_reaches_another_services_database_and_the_relay_only_reads_and_marks_outboxes(installation, users):
    urls = installation.database_urls
    for service in urls:
        for other, other_url in urls.items():
            if other != service:
                with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
                    psycopg.connect(_plain(users.database_url(service, other_url)))
    with psycopg.connect(_plain(users.database_url("lyric", urls["lyric"])), autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM jobs")
        for statement in ("CREATE DATABASE castad_not_mine", "CREATE ROLE not_mine", "SET ROLE postgres"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    for url in urls.values():
        with psycopg.connect(_plain(users.database_url("relay", url)), autocommit=True) as conn:
            conn.execute("SELECT id, envelope FROM outbox LIMIT 1")
            conn.execute("UPDATE outbox SET published_at = now(), parked_at = NULL WHERE false")
            conn.execute("SELECT reads FROM replicas LIMIT 1")  # what the service's replicas read
            for statement in (
                "SELECT 1 FROM inbox LIMIT 1",
                "UPDATE replicas SET reads = '{}' WHERE false",
                "UPDATE outbox SET envelope = '{}' WHERE false",
                "DELETE FROM outbox WHERE false",
                "INSERT INTO outbox (event_id) VALUES (gen_random_uuid())",
                "CREATE TABLE not_mine (id int)",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
        # Nor any other role (PostgreSQL before 15 lets every role create in schema public).
        with psycopg.connect(_plain(url), autocommit=True) as conn:
            assert conn.execute("SELECT has_schema_privilege('public', 'public', 'CREATE')").fetchone() == (False,)


def test_a_service_migrating_its_own_database_as_its_role_lets_in_the_relay_and_no_one_else():
    """The way a cluster does it (docs/deploy.md).

    Roles and an empty database owned by the service's role made by hand, then the service's own `migrate` (the
    chart's hook Job) as that role.
    """
    made = privileges.Users.new(f"m{uuid.uuid4().hex[:10]}")
    url = servers.database_url(f"castad_{made.namespace}_lyric")
    privileges.ensure_roles(made, servers.PG_URL)
    try:
        with psycopg.connect(_plain(servers.database_url("postgres")), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{make_url(url).database}" OWNER "{made.name("lyric")}"')
        env = {
            **os.environ,
            "CASTAD_LYRIC_DATABASE_URL": made.database_url("lyric", url),
            "CASTAD_OUTBOX_RELAY_ROLE": made.name("relay"),
        }
        done = subprocess.run(
            [sys.executable, "-m", "castad_lyric", "migrate"], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert f"open to its owner and {made.name('relay')} only" in done.stdout
        with psycopg.connect(_plain(made.database_url("relay", url))) as conn:
            conn.execute("UPDATE outbox SET published_at = now() WHERE false")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT 1 FROM jobs")
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(_plain(made.database_url("song", url)))
    finally:
        migrations.drop_database(url)
        privileges.drop_postgres(made, servers.PG_URL)


def test_no_broker_user_reaches_another_services_queue_and_only_the_relay_publishes_events_and_notices(
    installation, users
):
    topo = installation.topology

    def session(service: str, action: Callable[[Any], object]) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(users.amqp_url(service, installation.amqp_url)))
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            action(channel)
        finally:
            if connection.is_open:
                connection.close()

    def refused(service: str, action: Callable[[Any], object]) -> None:
        def attempt(channel: Any) -> None:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                action(channel)
            assert closed.value.reply_code == 403, closed.value

        session(service, attempt)

    # What each user needs works: a consumer reads its own queue, the relay publishes events.
    session("lyric", lambda channel: channel.basic_get(topo.queue("lyric")))
    session("api", lambda channel: channel.basic_get(topo.dead_letter_queue))
    session("relay", lambda channel: channel.basic_publish(topo.exchange, "nothing.bound", b"{}"))
    # Dead letters straight into the dead-letter exchange: the relay's notices of parked rows, and the gateway.
    for service in ("relay", "api"):
        session(service, lambda channel: channel.basic_publish(topo.dead_letter_exchange, "", b"{}"))
    song = topo.queue("song")
    for service in ("lyric", "api"):
        refused(service, lambda channel: channel.basic_get(song))
        refused(service, lambda channel: channel.queue_purge(song))
        refused(service, lambda channel: channel.queue_delete(song))
        refused(service, lambda channel: channel.queue_bind(song, topo.exchange, "#"))
        refused(service, lambda channel: channel.basic_publish(topo.exchange, "pipeline.requested", b"{}"))
        refused(service, lambda channel: channel.basic_publish("", song, b"{}"))
        refused(service, lambda channel: channel.basic_publish(topo.requeue_exchange(song), song, b"{}"))
    # A consumer binds its own queue with its own subscription's keys alone: it reads no other event.
    lyric = topo.queue("lyric")
    session("lyric", lambda channel: channel.queue_bind(lyric, topo.exchange, topo.bindings("lyric")[0]))
    for key in ("#", "song.completed", "lyric.*"):
        refused("lyric", lambda channel, key=key: channel.queue_bind(lyric, topo.exchange, key))
    refused("lyric", lambda channel: channel.exchange_delete(topo.exchange))  # the gateway's, which declares it
    refused("lyric", lambda channel: channel.basic_get(topo.dead_letter_queue))
    # A stage's dead letter is its own queue's, by the broker's word: it cannot publish one naming another queue.
    for service in topology.STAGES:
        refused(service, lambda channel: channel.basic_publish(topo.dead_letter_exchange, "", b"{}"))
        refused(service, lambda channel: channel.basic_publish("", topo.dead_letter_queue, b"{}"))
    # The relay binds a consumer's queue to the events it takes, and does nothing else with it.
    session("relay", lambda channel: channel.queue_bind(song, topo.exchange, "lyric.completed"))
    refused("relay", lambda channel: channel.queue_bind(song, topo.dead_letter_exchange, ""))
    refused("relay", lambda channel: channel.queue_purge(song))
    refused("relay", lambda channel: channel.queue_delete(song))
    refused("relay", lambda channel: channel.basic_get(topo.queue("lyric")))
    refused("relay", lambda channel: channel.queue_declare(f"{topo.namespace}.mine"))
    refused("relay", lambda channel: channel.basic_publish("", song, b"{}"))


def test_set_up_limits_the_length_of_each_services_queue_and_of_the_dead_letter_queue_not_of_the_delay_queues(
    installation, users
):
    listed = subprocess.run(
        ["rabbitmqctl", "--quiet", "list_queues", "name", "policy", "--formatter", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    topo = installation.topology
    policy = {row["name"]: row["policy"] for row in json.loads(listed.stdout) if row["name"].startswith(topo.namespace)}
    limited = {name for name, applied in policy.items() if applied == topo.limits_policy().name}
    assert limited == {*(topo.queue(service) for service in topo.services), topo.dead_letter_queue}
