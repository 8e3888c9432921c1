"""No role but a database's owner may create objects in its `public` schema.

So after set-up, or a service's own `migrate` with CASTAD_OUTBOX_RELAY_ROLE: not even the relay's, which connects
to every service's database.

PostgreSQL 15 no longer grants CREATE there to PUBLIC; 13 and 14 do (the schema owned by the bootstrap superuser),
and so does a cluster upgraded from them, which keeps the old grant. Each test puts that state back first, so on
the PostgreSQL 15 here it shows what happens on a 14.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from castad_local import privileges, stack
from castad_runtime import migrations
from sqlalchemy.engine import make_url

from tests.support import servers

pytestmark = pytest.mark.integration

LYRIC = next(database for database in stack.DATABASES if database.service == "lyric")


def _plain(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _superuser(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A superuser's session on the database of `url`."""
    return psycopg.connect(_plain(servers.database_url(make_url(url).database or "")), autocommit=True)


def _as_before_15(url: str, schema_owner: str | None = None) -> None:
    """The public schema as PostgreSQL 14 makes it: owned by the superuser (or `schema_owner`), PUBLIC may create."""
    with _superuser(url) as conn:
        conn.execute(
            f'ALTER SCHEMA public OWNER TO "{schema_owner}"'
            if schema_owner
            else "ALTER SCHEMA public OWNER TO CURRENT_USER"
        )
        conn.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        assert _public_may_create(url)


def _public_may_create(url: str) -> bool:
    with _superuser(url) as conn:
        row = conn.execute("SELECT has_schema_privilege('public', 'public', 'CREATE')").fetchone()
    assert row is not None
    return bool(row[0])


@pytest.fixture
def users() -> Iterator[privileges.Users]:
    made = privileges.Users.new(f"p{uuid.uuid4().hex[:10]}")
    privileges.ensure_roles(made, servers.PG_URL)
    try:
        yield made
    finally:
        migrations.drop_database(servers.database_url(f"castad_{made.namespace}_lyric"))
        privileges.drop_postgres(made, servers.PG_URL)


def test_set_up_takes_create_on_public_from_public_and_leaves_it_to_the_owner(users):
    url = servers.database_url(f"castad_{users.namespace}_lyric")
    migrations.ensure_database(url)
    migrations.upgrade(url, LYRIC.migrations_dir)  # as set-up does: as the superuser, before the roles own anything
    _as_before_15(url)

    privileges.grant_postgres(users, {"lyric": url})

    assert not _public_may_create(url)
    relay = psycopg.connect(_plain(users.database_url("relay", url)), autocommit=True)
    with relay, pytest.raises(psycopg.errors.InsufficientPrivilege):
        relay.execute("CREATE TABLE not_mine (id int)")
    with psycopg.connect(_plain(users.database_url("lyric", url)), autocommit=True) as conn:
        conn.execute("CREATE TABLE later_migration (id int)")  # the owner's next migration still can
        conn.execute("DROP TABLE later_migration")


def test_migrate_as_the_owner_of_the_schema_takes_create_from_public(users):
    """docs/deploy.md: before PostgreSQL 15, a superuser gives each database's public schema to its service's role."""
    owner = users.name("lyric")
    url = servers.database_url(f"castad_{users.namespace}_lyric")
    with _superuser(servers.PG_URL) as conn:
        conn.execute(f'CREATE DATABASE "{make_url(url).database}" OWNER "{owner}"')
    _as_before_15(url, schema_owner=owner)
    as_owner = users.database_url("lyric", url)

    migrations.upgrade(as_owner, LYRIC.migrations_dir)
    migrations.restrict_access(as_owner, users.name("relay"))

    assert not _public_may_create(url)


def test_migrate_refuses_to_leave_public_able_to_create_and_names_the_fix(users):
    owner = users.name("lyric")
    url = servers.database_url(f"castad_{users.namespace}_lyric")
    with _superuser(servers.PG_URL) as conn:
        conn.execute(f'CREATE DATABASE "{make_url(url).database}" OWNER "{owner}"')
    _as_before_15(url)  # the schema still the superuser's: the owner of the database cannot revoke
    as_owner = users.database_url("lyric", url)
    migrations.upgrade(as_owner, LYRIC.migrations_dir)

    with pytest.raises(migrations.AccessNotRestricted, match=f'ALTER SCHEMA public OWNER TO "?{owner}"?'):
        migrations.restrict_access(as_owner, users.name("relay"))
    assert _public_may_create(url)
