"""A running Castad per test: api, relay, lyric, song and video as separate processes.

Settings are the documented ones, tuned for speed: tiny videos, short backoff and
leases, so a pipeline takes a second or two and a lost lease is found in a few.
"""

from __future__ import annotations

import pathlib
import socket
import time
from collections.abc import Callable, Iterator, Mapping

import httpx
import pytest
from castad_cli import client as client_
from castad_cli import stack as stack_
from castad_contracts import api, brief

from tests.support import Installation

STAGES = ("LYRIC", "SONG", "VIDEO")
FAST = {
    "CASTAD_LOG_LEVEL": "INFO",
    "CASTAD_VIDEO_SHORT_SIDE": "144",
    "CASTAD_VIDEO_FPS": "4",
    "CASTAD_RELAY_FALLBACK_POLL_S": "1",
    "CASTAD_RELAY_RETRY_DELAY_S": "0.2",
    "CASTAD_API_SSE_POLL_S": "0.5",
    "CASTAD_API_SSE_PING_S": "1",
    **{
        f"CASTAD_{stage}_{name}": value
        for stage in STAGES
        for name, value in (
            ("BACKOFF_BASE_S", "0.05"),
            ("BACKOFF_MAX_S", "0.3"),
            ("LEASE_S", "3"),
            ("POLL_S", "0.2"),
            ("MAX_ATTEMPTS", "12"),
            ("CONCURRENCY", "4"),
        )
    },
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sample_brief(customer: str = "바다책방", duration_s: int = 3) -> brief.Brief:
    return brief.Brief(
        customer_name=customer,
        region="속초",
        detail_region_info="동명항 옆 작은 서점, 바다가 보이는 창가 자리",
        genre=brief.Genre.ACOUSTIC,
        orientation=brief.Orientation.VERTICAL,
        duration_s=duration_s,
    )


class RunningCastad:
    def __init__(self, installation: Installation, env: Mapping[str, str], log_dir: pathlib.Path) -> None:
        self.installation = installation
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.services = stack_.Stack({**installation.env(), **FAST, **env, "CASTAD_API_PORT": str(self.port)}, log_dir)
        self.client = client_.Client(self.base_url)
        self.http = httpx.Client(base_url=self.base_url, timeout=10)

    def start(self) -> None:
        self.services.start_all()
        self.services.wait_ready(self.base_url)

    def close(self) -> None:
        self.client.close()
        self.http.close()
        self.services.stop_all()

    def submit(self, body: brief.Brief | None = None, key: str | None = None) -> str:
        return self.client.submit(body or sample_brief(), key).id

    def wait_terminal(self, pipeline_ids: list[str], timeout_s: float = 120.0) -> dict[str, api.PipelineView]:
        """Poll until every pipeline is SUCCEEDED or FAILED; fail the test on timeout."""
        deadline = time.monotonic() + timeout_s
        views: dict[str, api.PipelineView] = {}
        pending = list(pipeline_ids)
        while pending:
            self.services.check_alive()
            for pipeline_id in list(pending):
                view = self.client.status(pipeline_id)
                if view.status in ("SUCCEEDED", "FAILED", "CANCELED"):
                    views[pipeline_id] = view
                    pending.remove(pipeline_id)
            if pending and time.monotonic() > deadline:
                states = {p: self.client.status(p).status for p in pending}
                pytest.fail(f"not finished after {timeout_s} s: {states}; logs in {self.services.log_dir}")
            if pending:
                time.sleep(0.2)
        return views


@pytest.fixture
def castad(installation: Installation, tmp_path: pathlib.Path) -> Iterator[Callable[..., RunningCastad]]:
    """Start a Castad with extra settings: `castad({"CASTAD_SONG_FAULT_FAILURE_RATE": "0.3"})`."""
    started: list[RunningCastad] = []

    def start(env: Mapping[str, str] | None = None) -> RunningCastad:
        running = RunningCastad(installation, env or {}, tmp_path / "logs")
        started.append(running)
        running.start()
        return running

    yield start
    for running in started:
        running.close()
