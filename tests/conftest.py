"""Fixtures shared by the integration and end-to-end tests.

Every test that needs servers gets an `Installation` of its own (tests/support/installation.py): a database per
service cloned on first use from templates migrated once per test session (once per xdist worker), and its own
RabbitMQ namespace. Nothing is shared with the local stack or with another test, so the tests can run next to
`make up` and beside each other.

A missing server is a failure, never a skip: `make test` starts or installs the servers before pytest runs, so a
missing one means the set-up is broken.

Under pytest-xdist (`make test`: `-n 4 --dist loadscope`) the end-to-end tests run in two units, each one test after
another on one worker, handed out first, the fault suite last of them, while the other workers run the rest beside
them (tests/support/scheduling.py); the rolling upgrade is handed out last, to run beside the fault suite.
"""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from castad_api import keys
from castad_local import access, stack
from castad_runtime import migrations
from sqlalchemy.engine import make_url

from tests.support import installation as installation_
from tests.support import object_store as object_store_
from tests.support import servers

# Last: the fault suite measures how soon work is taken over, so it comes once the other end-to-end tests are over;
# the rolling upgrade, the last unit handed out, runs beside it on the core the fault suite leaves mostly idle.
LAST = ("tests/upgrade/", "tests/e2e/test_fault_suite.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the rolling upgrade and the fault suite last."""
    items.sort(key=lambda item: item.nodeid.startswith(LAST))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadscope`: the end-to-end tests in two units, each on a worker (tests/support/scheduling.py)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from tests.support import scheduling  # imports xdist, which only a distributed run needs

    return scheduling.EndToEndInTurn(config, log)


@pytest.fixture(scope="session")
def migrated_templates() -> Iterator[dict[str, str]]:
    """A freshly migrated template database per service, made once per test session.

    The gateway's holds the tests' admin API key (TEST_KEY_TENANT), so every installation has it.
    """
    servers.require_servers()
    session = uuid.uuid4().hex[:8]
    templates = {}
    try:
        for database in stack.DATABASES:
            url = servers.database_url(f"castad_tpl_{session}_{database.service}")
            templates[database.service] = url
            migrations.ensure_database(url)
            migrations.upgrade(url, database.migrations_dir)
        env = {"CASTAD_API_DATABASE_URL": templates["api"]}
        installation_.TEST_KEYS["admin"] = access.create_key(
            installation_.TEST_KEY_TENANT, frozenset(keys.Scope), "tests: admin", env
        )
        yield {service: make_url(url).database or "" for service, url in templates.items()}
    finally:
        for url in templates.values():
            migrations.drop_database(url)


@pytest.fixture
def installation(migrated_templates: dict[str, str], tmp_path: pathlib.Path) -> Iterator[installation_.Installation]:
    with installation_.made(migrated_templates, tmp_path) as made:
        yield made


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object_store_.ObjectStore]:
    """An S3-compatible server for the session; each test makes a bucket of its own (`bucket`)."""
    store = object_store_.ObjectStore(tmp_path_factory.mktemp("moto") / "server.log")
    yield store
    store.stop()


@pytest.fixture
def bucket(object_store: object_store_.ObjectStore) -> str:
    name = f"castad-{uuid.uuid4().hex[:12]}"
    object_store.client().create_bucket(Bucket=name)
    return name
