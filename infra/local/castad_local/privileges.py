"""Least privilege: a PostgreSQL role and a RabbitMQ user per service, none a superuser.

- Each service's role owns its database, and only it and the relay's role may connect to it.
  The relay's role may read a database's outbox and mark its rows (an UPDATE of the relay's
  own columns), nothing else.
- Each broker user has `Topology.permissions`: a consuming service its own queues and
  exchanges, the relay publishing only.

`grant` makes them as PostgreSQL's superuser and with `rabbitmqctl` (set-up does, for the
local installation, keeping the passwords in var/local; a test does, for its own namespace);
`Users.env` gives the variables that run each service as its own user. `instructions` prints
the same grants for a platform team that makes the roles and users by hand (docs/deploy.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
import shlex
import shutil
import subprocess
import urllib.parse
from collections.abc import Mapping

import pika
import pika.exceptions
import psycopg
from castad_contracts import topology
from castad_runtime import amqp, db, migrations, settings
from psycopg import sql
from sqlalchemy.engine import make_url

from castad_local import REPO_ROOT

USERS = (*topology.WITH_DATABASE, topology.RELAY)
CREDENTIALS_FILE = REPO_ROOT / "var" / "local" / "credentials.json"
ENV_FILE = REPO_ROOT / "var" / "local" / "castad.env"  # `make up` gives it to honcho
RABBITMQCTL_TIMEOUT_S = 60.0
HOW = (
    "Run `make setup` as root once, or make the broker users that `.venv/bin/castad-admin privileges` lists"
    f" on the broker's node, with the passwords in {CREDENTIALS_FILE}."
)


def new_password() -> str:
    """192 random bits in hex: never a leading '-' (rabbitmqctl would read it as an option), nothing to quote."""
    return secrets.token_hex(24)


def usable(password: str) -> bool:
    return bool(password) and password[0].isalnum()


class PrivilegeError(Exception):
    """Roles or users could not be made; the message says what to do instead."""


@dataclasses.dataclass(frozen=True)
class Users:
    """The roles and broker users of one namespace: `<namespace>_<service>`, with their passwords."""

    namespace: str
    passwords: Mapping[str, str]  # service -> password (the same for its role and its broker user)

    @classmethod
    def new(cls, namespace: str) -> Users:
        return cls(namespace, {service: new_password() for service in USERS})

    def name(self, service: str) -> str:
        return f"{self.namespace}_{service}"

    def database_url(self, service: str, database_url: str) -> str:
        """`database_url` (of a superuser) with this service's role instead."""
        url = make_url(database_url).set(username=self.name(service), password=self.passwords[service])
        return url.render_as_string(hide_password=False)

    def amqp_url(self, service: str, amqp_url: str) -> str:
        """`amqp_url` (an administrator's; one URL or one per node) with this service's user on every node."""
        user = urllib.parse.quote(self.name(service), safe="")
        password = urllib.parse.quote(self.passwords[service], safe="")
        nodes = []
        for url in amqp.split(amqp_url):
            parts = urllib.parse.urlsplit(url)
            host = parts.netloc.rpartition("@")[2]
            nodes.append(urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}")))
        return ",".join(nodes)

    def env(self, database_urls: Mapping[str, str], amqp_url: str) -> dict[str, str]:
        """Variables that run every service as its own user (superuser `database_urls` per service)."""
        sources = (f"{service}={self.database_url(topology.RELAY, url)}" for service, url in database_urls.items())
        result = {"CASTAD_RELAY_SOURCES": ",".join(sources)}
        for service, url in database_urls.items():
            result[f"CASTAD_{service.upper()}_DATABASE_URL"] = self.database_url(service, url)
        for service in USERS:
            result[f"CASTAD_{service.upper()}_AMQP_URL"] = self.amqp_url(service, amqp_url)
        return result


def local_users(namespace: str, path: pathlib.Path = CREDENTIALS_FILE) -> Users:
    """The users of the local installation, their passwords kept in `path` (made on first use)."""
    if path.exists():
        stored = json.loads(path.read_text())
        passwords = stored.get("passwords", {})
        # made anew if not all usable: an early version's might start with '-'
        usable_all = all(map(usable, passwords.values()))
        if stored.get("namespace") == namespace and set(passwords) == set(USERS) and usable_all:
            return Users(namespace, passwords)
    users = Users.new(namespace)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(json.dumps({"namespace": namespace, "passwords": dict(users.passwords)}, indent=2))
    return users


def grant(users: Users, database_urls: Mapping[str, str], amqp_url: str) -> None:
    """Make (or bring up to date) every role and broker user; `database_urls` are a superuser's."""
    grant_postgres(users, database_urls)
    grant_rabbitmq(users, amqp_url)


def grant_postgres(users: Users, database_urls: Mapping[str, str]) -> None:
    """Each service's role owns its database and what is in it; the relay's role reads and marks outboxes."""
    any_url = next(iter(database_urls.values()))
    ensure_roles(users, any_url)
    with _connect(db.maintenance_url(any_url)) as conn:
        for service, url in database_urls.items():
            database = sql.Identifier(make_url(url).database or "")
            conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(database, sql.Identifier(users.name(service))))
    for service, url in database_urls.items():
        with _connect(url) as conn:
            _give_objects(conn, users.name(service))
            _give_public_schema(conn, users.name(service))
        migrations.restrict_access(url, users.name(topology.RELAY))


def _connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(**db.connect_kwargs(url), autocommit=True)


def ensure_roles(users: Users, admin_url: str) -> None:
    """Every role, able to log in with its password and nothing more (as a superuser at `admin_url`)."""
    with _connect(db.maintenance_url(admin_url)) as conn:
        for service in USERS:
            role = users.name(service)
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            statement = " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD {}"
            conn.execute(
                sql.SQL(("ALTER" if exists else "CREATE") + statement).format(
                    sql.Identifier(role), sql.Literal(users.passwords[service])
                )
            )


def _give_objects(conn: psycopg.Connection[tuple[object, ...]], owner: str) -> None:
    """Tables, sequences and views the superuser made (migrated before the roles existed) go to the owner."""
    rows = conn.execute(
        """
        SELECT c.oid::regclass::text FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
          AND pg_get_userbyid(c.relowner) <> %s
          AND NOT EXISTS (SELECT 1 FROM pg_depend AS d  -- a serial's sequence follows its table
                          WHERE d.objid = c.oid AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
        """,
        (owner,),
    ).fetchall()
    for (name,) in rows:
        conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.SQL(str(name)), sql.Identifier(owner)))


def _give_public_schema(conn: psycopg.Connection[tuple[object, ...]], owner: str) -> None:
    """Where PUBLIC may create in the public schema (PostgreSQL before 15, or a cluster upgraded from one), the
    schema goes to the owner, as PostgreSQL 15 has it (pg_database_owner): the owner keeps creating there once
    `restrict_access` took that from PUBLIC, and its own `migrate` can take it again."""
    row = conn.execute("SELECT has_schema_privilege('public', 'public', 'CREATE')").fetchone()
    if row is not None and row[0]:
        conn.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(owner)))


def drop_postgres(users: Users, admin_url: str) -> None:
    """Remove the roles (their databases dropped first)."""
    with _connect(db.maintenance_url(admin_url)) as conn:
        for service in USERS:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(users.name(service))))


def grant_rabbitmq(users: Users, amqp_url: str) -> None:
    """Each broker user with its password and its permissions on the URL's vhost.

    `Topology.permissions`, and `Topology.topic_permissions` on the events exchange.
    """
    vhost = _vhost(amqp_url)
    existing = {row["user"] for row in _rabbitmqctl("list_users", "--formatter", "json")}
    granted = {row["user"]: row for row in _rabbitmqctl("list_permissions", "-p", vhost, "--formatter", "json")}
    topics = {
        (row["user"], row["exchange"]): (row["write"], row["read"])
        for row in _rabbitmqctl("list_topic_permissions", "-p", vhost, "--formatter", "json")
    }
    topo = topology.Topology(users.namespace)
    for service in USERS:
        name, password = users.name(service), users.passwords[service]
        if name not in existing:
            _rabbitmqctl("add_user", name, password)
        elif not _authenticates(users.amqp_url(service, amqp_url)):
            _rabbitmqctl("change_password", name, password)
        wanted = dataclasses.astuple(topo.permissions(service))
        if tuple(granted.get(name, {}).get(key) for key in ("configure", "write", "read")) != wanted:
            _rabbitmqctl("set_permissions", "-p", vhost, name, *wanted)
        topic = topo.topic_permissions(service)
        if topics.get((name, topic.exchange)) != (topic.write, topic.read):
            _rabbitmqctl("set_topic_permissions", "-p", vhost, name, topic.exchange, topic.write, topic.read)
    _rabbitmqctl(*topo.limits_policy().command(vhost))


def drop_rabbitmq(users: Users, amqp_url: str) -> None:
    """Delete the broker users, and the queue limits of their namespace."""
    existing = {row["user"] for row in _rabbitmqctl("list_users", "--formatter", "json")}
    for service in USERS:
        if users.name(service) in existing:
            _rabbitmqctl("delete_user", users.name(service))
    vhost, policy = _vhost(amqp_url), topology.Topology(users.namespace).limits_policy().name
    if any(row["name"] == policy for row in _rabbitmqctl("list_policies", "-p", vhost, "--formatter", "json")):
        _rabbitmqctl("clear_policy", "-p", vhost, policy)


def _vhost(amqp_url: str) -> str:
    """The vhost of a broker setting (its first node's URL: every node's names the same vhost)."""
    path = urllib.parse.urlsplit(amqp.split(amqp_url)[0]).path
    return urllib.parse.unquote(path[1:]) if len(path) > 1 else "/"


def _authenticates(amqp_url: str) -> bool:
    try:
        amqp.blocking_connection(amqp_url, timeout_s=5).close()
        return True
    except pika.exceptions.AMQPConnectionError:  # refused, or not yet allowed on the vhost
        return False


def _rabbitmqctl(*arguments: str) -> list[dict[str, object]]:
    """Run rabbitmqctl (on this machine's broker); its JSON answer, if it gives one."""
    if shutil.which("rabbitmqctl") is None:
        raise PrivilegeError(f"rabbitmqctl is not installed here, so no broker user can be made. {HOW}")
    done = subprocess.run(
        ["rabbitmqctl", "--quiet", *arguments], capture_output=True, text=True, timeout=RABBITMQCTL_TIMEOUT_S
    )
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise PrivilegeError(
            f"rabbitmqctl {arguments[0]} failed ({reason[-1] if reason else done.returncode}): it must run as root"
            f" or as the rabbitmq user. {HOW}"
        )
    out = done.stdout.strip()
    return json.loads(out) if out.startswith("[") else []


def instructions(namespace: str = topology.DEFAULT_NAMESPACE, vhost: str = "/") -> str:
    """The roles, grants and broker users to make by hand (passwords to choose), as commands."""
    users = Users(namespace, {service: f"<{service} password>" for service in USERS})
    topo = topology.Topology(namespace)
    relay = users.name(topology.RELAY)
    lines = ["-- PostgreSQL, as a superuser (each database named as in CASTAD_<SERVICE>_DATABASE_URL):"]
    for service in USERS:
        lines.append(f"CREATE ROLE {users.name(service)} LOGIN PASSWORD '<{service} password>';")
    for service in topology.WITH_DATABASE:
        database = make_url(settings.database_url_default(service)).database
        lines.append(f"CREATE DATABASE {database} OWNER {users.name(service)};")
    lines.append("-- Before PostgreSQL 15 (or upgraded from one), where PUBLIC may create in schema public:")
    for service in topology.WITH_DATABASE:
        database = make_url(settings.database_url_default(service)).database
        lines += [f"\\connect {database}", f"ALTER SCHEMA public OWNER TO {users.name(service)};"]
    lines += [
        f"-- then each service's `migrate`, run as its own role with CASTAD_OUTBOX_RELAY_ROLE={relay}, closes its",
        f"-- database to every other role, takes CREATE on schema public from PUBLIC, and lets {relay} read its",
        "-- outbox, mark the rows and read what the service's replicas read (table replicas).",
        "",
        "# RabbitMQ (rabbitmqctl on a broker node):",
    ]
    for service in USERS:
        permissions = dataclasses.astuple(topo.permissions(service))
        topic = topo.topic_permissions(service)
        lines += [
            f"rabbitmqctl add_user {users.name(service)} '<{service} password>'",
            f"rabbitmqctl set_permissions -p {vhost} {users.name(service)} " + " ".join(f"'{p}'" for p in permissions),
            f"rabbitmqctl set_topic_permissions -p {vhost} {users.name(service)} {topic.exchange}"
            f" '{topic.write}' '{topic.read}'",
        ]
    lines.append("# The length limit of the queues (docs/deploy.md, RabbitMQ):")
    lines.append("rabbitmqctl " + " ".join(shlex.quote(part) for part in topo.limits_policy().command(vhost)))
    return "\n".join(lines)


def local_env() -> dict[str, str]:
    """Variables that run the local installation's services each as its own user (made by `grant_local`)."""
    common = settings.CommonSettings()
    return local_users(common.namespace).env(_local_database_urls(), common.amqp_url)


def grant_local(extra: Mapping[str, str] | None = None) -> pathlib.Path:
    """Make the local installation's roles and users; write `local_env` (and `extra`) for `make up` into
    ENV_FILE.

    Without rabbitmqctl's rights (not root), broker users that a run as root made and that still log
    in with their passwords are kept as they are."""
    common = settings.CommonSettings()
    users = local_users(common.namespace)
    grant_postgres(users, _local_database_urls())
    try:
        grant_rabbitmq(users, common.amqp_url)
    except PrivilegeError:
        if not all(_authenticates(users.amqp_url(service, common.amqp_url)) for service in USERS):
            raise
    ENV_FILE.touch(mode=0o600)
    variables = {**local_env(), **(extra or {})}
    ENV_FILE.write_text("".join(f"{name}={value}\n" for name, value in variables.items()))
    return ENV_FILE


def _local_database_urls() -> dict[str, str]:
    """Each service's database as its settings name it: set-up's, a superuser's."""
    return {
        service: os.environ.get(f"CASTAD_{service.upper()}_DATABASE_URL", settings.database_url_default(service))
        for service in topology.WITH_DATABASE
    }
