"""What every connection to the broker and the database is given.

Several nodes or hosts, timeouts, and what a URL sets itself winning.
"""

from __future__ import annotations

import os

from castad_runtime import amqp, db

NODES = "amqp://u:p@n1:5672/%2F,amqp://u:p@n2:5672/%2F, amqp://u:p@n3:5672/%2F"


def test_every_node_of_a_broker_setting_is_tried_in_an_order_drawn_anew_for_each_connection():
    orders = {tuple(parameters.host for parameters in amqp.pika_parameters(NODES)) for _ in range(50)}

    assert all(sorted(order) == ["n1", "n2", "n3"] for order in orders)
    assert len(orders) > 1


def test_a_broker_connection_has_heartbeats_keepalives_a_user_timeout_and_one_try_per_node():
    [parameters] = amqp.pika_parameters("amqp://u:p@n1:5672/%2F")

    assert parameters.heartbeat == amqp.HEARTBEAT_S
    assert parameters.tcp_options == {**amqp.KEEPALIVE, "TCP_USER_TIMEOUT": amqp.TCP_USER_TIMEOUT_MS}
    assert parameters.connection_attempts == 1
    assert parameters.socket_timeout == parameters.stack_timeout == amqp.CONNECT_TIMEOUT_S


def test_what_a_broker_url_sets_itself_wins():
    url = "amqp://u:p@n1:5672/%2F?heartbeat=30&connection_attempts=3&socket_timeout=2&tcp_options={'TCP_KEEPIDLE':60}"
    [parameters] = amqp.pika_parameters(url, timeout_s=1)

    assert (parameters.heartbeat, parameters.connection_attempts, parameters.socket_timeout) == (30, 3, 2)
    assert parameters.tcp_options["TCP_KEEPIDLE"] == 60
    assert parameters.tcp_options["TCP_USER_TIMEOUT"] == amqp.TCP_USER_TIMEOUT_MS  # merged, not dropped


def test_a_database_url_with_several_hosts_connects_to_the_one_that_takes_writes_whichever_form_it_takes():
    repeated = "postgresql+psycopg://u@/castad_api?host=h1:5432&host=h2:5433"
    libpq = "postgresql+psycopg://u@/castad_api?host=h1,h2&port=5432,5433"

    assert db.connect_args(repeated)["target_session_attrs"] == "read-write"
    assert db.connect_args(libpq)["target_session_attrs"] == "read-write"
    assert db.connect_kwargs(repeated) | {"host": "h1,h2", "port": "5432,5433", "dbname": "castad_api"} == (
        db.connect_kwargs(repeated)
    )


def test_a_database_url_keeps_its_own_timeouts_and_session_attributes_and_gets_the_rest():
    url = "postgresql+psycopg://u@h1:5432/castad_api?connect_timeout=9&target_session_attrs=any"

    added = db.connect_args(url)

    assert "connect_timeout" not in added and "target_session_attrs" not in added
    assert {key: added[key] for key in ("keepalives", "tcp_user_timeout")} == {
        "keepalives": 1,
        "tcp_user_timeout": db.TIMEOUTS["tcp_user_timeout"],
    }
    assert db.connect_kwargs(url)["connect_timeout"] == "9"


def test_a_single_host_database_url_is_not_made_to_insist_on_a_writable_host():
    assert "target_session_attrs" not in db.connect_args("postgresql+psycopg://u@h1:5432/castad_api")


def test_the_maintenance_url_changes_the_database_alone():
    url = "postgresql+psycopg://u:s%40cret@/castad_api?host=h1:5432&host=h2:5433&connect_timeout=9"

    assert db.maintenance_url(url) == (
        "postgresql+psycopg://u:s%40cret@/postgres?connect_timeout=9&host=h1%3A5432&host=h2%3A5433"
    )
    kwargs = db.connect_kwargs(db.maintenance_url(url))
    assert (kwargs["dbname"], kwargs["password"]) == ("postgres", "s@cret")
    assert kwargs["target_session_attrs"] == "read-write"


def test_every_session_names_its_process_to_postgresql_unless_the_url_names_it():
    """What lets an operator (and the fault harness) tell which process holds a session idle in a transaction."""
    named = db.connect_args("postgresql+psycopg://u@h1:5432/castad_api")["application_name"]

    assert named.startswith(f"castad:{os.getpid()}@") and len(named) <= 63
    assert "application_name" not in db.connect_args("postgresql+psycopg://u@h1/castad_api?application_name=mine")
