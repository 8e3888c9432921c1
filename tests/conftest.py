"""Fixtures shared by the integration and end-to-end tests.

Every test that needs servers gets an `Installation` of its own: one database per
service, cloned from templates migrated once per test session, and its own
RabbitMQ namespace (exchange, queues and bindings). Nothing is shared with the
local stack or with another test, so the tests can run next to `make up`.

A missing server is a failure, never a skip: `make test` starts or installs the
servers before pytest runs, so a missing one means the set-up is broken.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator

import pytest
from castad_api import keys
from castad_local import access, stack
from castad_runtime import messaging, migrations, wakeups
from sqlalchemy.engine import make_url

from tests import support
from tests.support import TEST_KEY_TENANT, Installation, ObjectStore, database_url, require_servers

SERVICES = tuple(database.service for database in stack.DATABASES)


@pytest.fixture(scope="session")
def migrated_templates() -> Iterator[dict[str, str]]:
    """A freshly migrated template database per service, made once per test session.

    The gateway's holds the tests' admin API key (TEST_KEY_TENANT), so every installation has it.
    """
    require_servers()
    session = uuid.uuid4().hex[:8]
    templates = {}
    try:
        for database in stack.DATABASES:
            url = database_url(f"castad_tpl_{session}_{database.service}")
            templates[database.service] = url
            migrations.ensure_database(url)
            migrations.upgrade(url, database.migrations_dir)
        env = {"CASTAD_API_DATABASE_URL": templates["api"]}
        support.TEST_KEYS["admin"] = access.create_key(TEST_KEY_TENANT, frozenset(keys.Scope), "tests: admin", env)
        yield {service: make_url(url).database or "" for service, url in templates.items()}
    finally:
        for url in templates.values():
            migrations.drop_database(url)


@pytest.fixture
def installation(migrated_templates: dict[str, str], tmp_path: pathlib.Path) -> Iterator[Installation]:
    test_id = uuid.uuid4().hex[:10]
    urls = {service: database_url(f"castad_t{test_id}_{service}") for service in SERVICES}
    result = Installation(f"t{test_id}", urls, tmp_path / "artifacts")
    try:
        for service, url in urls.items():
            migrations.ensure_database(url, template=migrated_templates[service])
        messaging.declare_topology(result.amqp_url, result.topology)
        yield result
    finally:
        wakeups.close_all()  # their connections to the databases about to be dropped
        messaging.delete_topology(result.amqp_url, result.topology)
        for url in urls.values():
            migrations.drop_database(url)


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    """An S3-compatible server for the session; each test makes a bucket of its own (`bucket`)."""
    store = ObjectStore(tmp_path_factory.mktemp("moto") / "server.log")
    yield store
    store.stop()


@pytest.fixture
def bucket(object_store: ObjectStore) -> str:
    name = f"castad-{uuid.uuid4().hex[:12]}"
    object_store.client().create_bucket(Bucket=name)
    return name
