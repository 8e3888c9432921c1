"""A real S3-compatible server on 127.0.0.1 for the session (moto's server mode)."""

from __future__ import annotations

import pathlib
import socket
import subprocess
import sys
import time
from typing import Any

import boto3
import pytest
from castad_local import stack


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
