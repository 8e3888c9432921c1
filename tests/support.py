"""What the integration and end-to-end tests share besides fixtures: an isolated installation."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.parse
from typing import Any

import boto3
import pytest
from castad_contracts import topology
from castad_local import stack
from castad_runtime import links, settings
from pydantic import SecretStr
from sqlalchemy.engine import make_url

AMQP_URL = os.environ.get("CASTAD_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
PG_URL = os.environ.get("CASTAD_TEST_PG_URL", settings.DEFAULT_PG)


def _reachable(url: str, default_port: int) -> bool:
    parsed = make_url(url.replace("amqp://", "postgresql://", 1))
    try:
        with socket.create_connection((parsed.host or "127.0.0.1", parsed.port or default_port), timeout=3):
            return True
    except OSError:
        return False


def require_servers() -> None:
    missing = [
        name
        for name, url, port in (("PostgreSQL", PG_URL, 5432), ("RabbitMQ", AMQP_URL, 5672))
        if not _reachable(url, port)
    ]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not reachable: run `make setup` (or `make test`, which runs it)")


def database_url(name: str) -> str:
    return f"{PG_URL}/{name}"


TEST_KEY_TENANT = "tests"
TEST_KEYS: dict[str, str] = {}  # made once per session in the template of the gateway's database


@dataclasses.dataclass(frozen=True)
class Installation:
    """One isolated Castad: a database per service, a namespace on the broker, a directory for files."""

    namespace: str
    database_urls: dict[str, str]
    artifacts_dir: pathlib.Path
    amqp_url: str = AMQP_URL

    @property
    def topology(self) -> topology.Topology:
        return topology.Topology(self.namespace)

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


class ObjectStore:
    """A real S3-compatible server on 127.0.0.1 (moto's server mode) in a process of its own."""

    REGION = "us-east-1"
    ENV = {"AWS_ACCESS_KEY_ID": "castad-test", "AWS_SECRET_ACCESS_KEY": "castad-test-secret"}

    def __init__(self, log: pathlib.Path) -> None:
        self.port = stack.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("wb")
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while self.process.poll() is None and time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        self.stop()
        pytest.fail(f"moto server did not start; see {log}")

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=self.REGION,
            aws_access_key_id=self.ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.ENV["AWS_SECRET_ACCESS_KEY"],
        )

    def env(self, bucket: str) -> dict[str, str]:
        """The variables that point every service at a bucket of this store."""
        return {
            **self.ENV,
            "CASTAD_ARTIFACTS_STORE": "s3",
            "CASTAD_ARTIFACTS_S3_BUCKET": bucket,
            "CASTAD_ARTIFACTS_S3_ENDPOINT_URL": self.url,
            "CASTAD_ARTIFACTS_S3_REGION": self.REGION,
        }

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


LINK_SECRET = "castad-tests-link-secret-0123456789abcdef"  # CASTAD_API_LINK_SECRET of the tests


def link_secrets() -> dict[str, str]:
    """The gateway's root link secret and each signing stage's key derived from it, as their variables."""
    root = SecretStr(LINK_SECRET)
    return {
        "CASTAD_API_LINK_SECRET": LINK_SECRET,
        **{
            f"CASTAD_{s.value.upper()}_LINK_SECRET": links.stage_secret(root, s).get_secret_value()
            for s in links.SIGNERS
        },
    }


def stage_link_secret(stage: str) -> SecretStr:
    """A signing stage's key, derived from LINK_SECRET as `python -m castad_api link-secrets` derives it."""
    return links.stage_secret(SecretStr(LINK_SECRET), stage)


def signed_path(url: str, base_url: str) -> str:
    """The path of a link a stage signed (castad_runtime.links) as the gateway takes it; fails unless valid."""
    assert url.startswith(base_url), url
    parsed = urllib.parse.urlparse(url)
    query = urllib.parse.parse_qs(parsed.query)
    expires, signature = int(query["expires"][0]), query["signature"][0]
    assert links.accepted(SecretStr(LINK_SECRET), parsed.path, expires, signature, max_s=6 * 3600), url
    return parsed.path
