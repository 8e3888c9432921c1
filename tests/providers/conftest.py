"""What every adapter test gets: its own artifacts directory, its clients closed, the fakes it used quiet after it."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from castad_local.fakes.server import FakeServer
from castad_runtime.stage import http


@pytest.fixture(autouse=True)
def artifacts_dir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """A temporary CASTAD_ARTIFACTS_DIR; every HTTP client the test made is closed after it."""
    root = tmp_path / "artifacts"
    monkeypatch.setenv("CASTAD_ARTIFACTS_DIR", str(root))
    monkeypatch.setenv("CASTAD_ARTIFACTS_STORE", "volume")
    clients: list[http.HttpProvider] = []

    class Tracked(http.HttpProvider):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            clients.append(self)

    monkeypatch.setattr(http, "HttpProvider", Tracked)
    yield root
    for thread in threading.enumerate():  # calls a cancel abandoned end by their own timeout
        if thread.name == "provider-call":
            thread.join(10)
    for client in clients:
        client.close()


@pytest.fixture(autouse=True)
def fakes_quiet(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test ends once the fakes it used have answered everything: a submit that hung past the adapter's timeout
    still makes its task when it wakes, and must not make it in the next test of a module's fake."""
    yield
    for value in request.node.funcargs.values():
        if isinstance(value, FakeServer):
            assert value.idle(), "the fake still answers a request"
