"""An isolated Castad for a test: a database per service, a namespace on the broker, a folder for files.

Made lazily: a database is cloned from its migrated template when the test first asks for its URL, the broker
topology is declared when the test first asks for the broker's URL. A test of the gateway's SQL pays for one
database and no broker; `close` removes only what was made.
"""

from __future__ import annotations

import contextlib
import pathlib
import uuid
from collections.abc import Iterator, Mapping

from castad_contracts import topology
from castad_runtime import messaging, migrations, wakeups

from tests.support import servers

TEST_KEY_TENANT = "tests"
TEST_KEYS: dict[str, str] = {}  # made once per session in the template of the gateway's database


class Databases(Mapping[str, str]):
    """Service -> URL of its database, the database cloned from its template on first use."""

    def __init__(self, prefix: str, templates: Mapping[str, str]) -> None:
        self._urls = {service: servers.database_url(f"{prefix}_{service}") for service in topology.WITH_DATABASE}
        self._templates = templates
        self.made: list[str] = []

    def __getitem__(self, service: str) -> str:
        url = self._urls[service]
        if service not in self.made:
            migrations.ensure_database(url, template=self._templates[service])
            self.made.append(service)
        return url

    def __iter__(self) -> Iterator[str]:
        return iter(self._urls)

    def __len__(self) -> int:
        return len(self._urls)

    def drop(self) -> None:
        if self.made:
            wakeups.close_all()  # their connections to the databases about to be dropped
        for service in self.made:
            migrations.drop_database(self._urls[service])
        self.made.clear()


class Installation:
    """One isolated Castad: a database per service, a namespace on the broker, a directory for files."""

    def __init__(
        self,
        namespace: str,
        templates: Mapping[str, str],
        artifacts_dir: pathlib.Path,
        amqp_url: str = servers.AMQP_URL,
    ) -> None:
        self.namespace = namespace
        self.database_urls = Databases(f"castad_{namespace}", templates)
        self.artifacts_dir = artifacts_dir
        self._amqp_url = amqp_url
        self._declared = False

    @property
    def topology(self) -> topology.Topology:
        return topology.Topology(self.namespace)

    @property
    def amqp_url(self) -> str:
        """The broker's URL, the installation's exchange, queues and bindings declared on first use."""
        if not self._declared:
            messaging.declare_topology(self._amqp_url, self.topology)
            self._declared = True
        return self._amqp_url

    @property
    def api_key(self) -> str:
        """An admin key of the tenant `tests`, known to this installation's gateway."""
        return TEST_KEYS["admin"]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def env(self) -> dict[str, str]:
        """The CASTAD_* variables that point every service at this installation."""
        return {
            "CASTAD_AMQP_URL": self.amqp_url,
            "CASTAD_NAMESPACE": self.namespace,
            "CASTAD_ARTIFACTS_DIR": str(self.artifacts_dir),
            "CASTAD_RELAY_SOURCES": ",".join(f"{svc}={url}" for svc, url in self.database_urls.items()),
            **{f"CASTAD_{service.upper()}_DATABASE_URL": url for service, url in self.database_urls.items()},
        }

    def close(self) -> None:
        """Drop the databases and delete the topology that were made."""
        try:
            if self._declared:
                messaging.delete_topology(self._amqp_url, self.topology)
        finally:
            self.database_urls.drop()


@contextlib.contextmanager
def made(templates: Mapping[str, str], base: pathlib.Path, prefix: str = "t") -> Iterator[Installation]:
    """A new installation with its files under `base`, removed at the end (for a test, a module or the session)."""
    installation = Installation(f"{prefix}{uuid.uuid4().hex[:10]}", templates, base / "artifacts")
    try:
        yield installation
    finally:
        installation.close()
