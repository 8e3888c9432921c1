from __future__ import annotations

import json

from castad_contracts import topology
from castad_local import privileges


def test_new_passwords_never_look_like_a_command_line_option():
    # rabbitmqctl reads an argument that starts with '-' as an option and refuses add_user.
    for _ in range(2000):
        users = privileges.Users.new("t1")
        assert all(password[0].isalnum() for password in users.passwords.values())


def test_stored_passwords_that_rabbitmqctl_would_refuse_are_replaced(tmp_path):
    path = tmp_path / "credentials.json"
    bad = {service: "-starts-with-a-dash" for service in privileges.USERS}
    path.write_text(json.dumps({"namespace": "t1", "passwords": bad}))
    users = privileges.local_users("t1", path)
    assert all(privileges.usable(password) for password in users.passwords.values())
    assert privileges.local_users("t1", path) == users  # kept from now on


def test_each_service_gets_its_own_role_and_broker_user_in_its_urls():
    users = privileges.Users("t1", {service: f"pw-{service}" for service in privileges.USERS})
    env = users.env(
        {"lyric": "postgresql+psycopg://postgres@127.0.0.1:5432/castad_lyric"}, "amqp://guest:guest@127.0.0.1:5672/%2F"
    )
    assert env["CASTAD_LYRIC_DATABASE_URL"] == "postgresql+psycopg://t1_lyric:pw-lyric@127.0.0.1:5432/castad_lyric"
    assert env["CASTAD_RELAY_SOURCES"] == "lyric=postgresql+psycopg://t1_relay:pw-relay@127.0.0.1:5432/castad_lyric"
    assert env["CASTAD_SONG_AMQP_URL"] == "amqp://t1_song:pw-song@127.0.0.1:5672/%2F"


def test_a_services_broker_url_has_its_own_user_on_every_node_of_a_cluster():
    users = privileges.Users("castad", {service: f"pw-{service}" for service in privileges.USERS})
    admin = "amqp://admin:secret@n1:5672/castad,amqp://admin:secret@n2:5672/castad"

    url = users.amqp_url("lyric", admin)

    assert url == "amqp://castad_lyric:pw-lyric@n1:5672/castad,amqp://castad_lyric:pw-lyric@n2:5672/castad"
    assert "admin" not in url and privileges._vhost(admin) == "castad"


def test_the_instructions_give_each_databases_public_schema_to_its_service_for_postgresql_before_15():
    # There PUBLIC may create in schema public, and only the schema's owner (or a superuser) can take it back:
    # the service's `migrate` does, once its role owns the schema.
    lines = privileges.instructions("castad").splitlines()
    for service in topology.WITH_DATABASE:
        at = lines.index(f"\\connect castad_{service}")
        assert lines[at + 1] == f"ALTER SCHEMA public OWNER TO castad_{service};"
