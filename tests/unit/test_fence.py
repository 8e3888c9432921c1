"""The pure parts of what guards work leaving for a provider.

An attempt's submission key, what a worker knows of its lease by its own clock, and the order of things in a submit
(the fence last, just before the request is sent). The fence's record in the database is tested in
tests/integration/test_fence.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http import server as http_server

import httpx
import pytest
from castad_contracts import codes
from castad_runtime import outbound
from castad_runtime.stage import cancellation, errors, fence, http, leases, machine, repository

LEASE_S = 3600.0  # the heartbeat would first renew in 20 minutes: it never runs here


def job(**fields: object) -> repository.Job:
    values: dict[str, object] = {
        "id": uuid.UUID(int=1),
        "pipeline_id": "8b8e3c59-6f0c-4a47-b1a7-3c2e6e0a9d11",
        "status": machine.Status.RUNNING,
        "version": 3,
        "attempts": 1,
        "counted_attempts": 0,
        "max_attempts": 5,
        "input": {},
        "traceparent": None,
        "tracestate": None,
    }
    return repository.Job(**{**values, **fields})  # type: ignore[arg-type]


def test_a_submission_key_names_the_pipeline_its_run_and_its_counted_attempt():
    assert job().submission_key == "castad-8b8e3c59-6f0c-4a47-b1a7-3c2e6e0a9d11-0-1"
    key = job(reopened=2, counted_attempts=3).submission_key
    assert key.endswith("-2-4") and key.isascii() and key.isprintable() and len(key) <= 255


def test_an_attempt_claimed_again_after_the_machinery_lost_it_keeps_its_key():
    first = job(attempts=1, version=3)
    claimed_again = dataclasses.replace(first, attempts=2, version=5)  # handed back uncounted, then claimed
    assert claimed_again.submission_key == first.submission_key


def test_a_counted_failure_or_an_operators_retry_gives_the_next_attempt_a_new_key():
    first = job()
    after_a_failure = dataclasses.replace(first, attempts=2, counted_attempts=1)
    retried = dataclasses.replace(first, attempts=3, counted_attempts=0, reopened=1)
    assert len({first.submission_key, after_a_failure.submission_key, retried.submission_key}) == 3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def held(clock: Clock) -> Iterator[leases.Leases]:
    """Leases of one job, without a database: released after the test, so their heartbeat ends on its first turn."""
    made = leases.Leases(engine=None, lease_s=LEASE_S, name="test", clock=clock)  # type: ignore[arg-type]
    yield made
    made.release(job().id)


def test_a_lease_is_known_held_from_its_claim_until_a_lease_later_less_the_margin(held, clock):
    claim = job()
    held.hold(claim, on_lost=lambda: None, since=clock.now - 1)  # its transaction began a second ago

    assert held.known_held(claim, margin_s=10)
    clock.now += LEASE_S - 12
    assert held.known_held(claim, margin_s=10)
    clock.now += 2  # a worker frozen this long, its heartbeat with it, does not know it any more
    assert not held.known_held(claim, margin_s=10)


def test_what_the_database_says_is_left_of_a_lease_is_known_from_when_it_was_asked(held, clock):
    claim = job()
    held.hold(claim, on_lost=lambda: None, since=clock.now)
    clock.now += LEASE_S

    held.confirmed(claim, since=clock.now - 5, left_s=20)  # asked 5 s ago: 20 s were left then

    assert held.known_held(claim, margin_s=14)
    assert not held.known_held(claim, margin_s=15)


def test_a_released_claim_or_another_claim_of_the_same_job_is_not_known_held(held, clock):
    claim = job()
    held.hold(claim, on_lost=lambda: None, since=clock.now)
    taken_again = dataclasses.replace(claim, version=claim.version + 1)
    assert not held.known_held(taken_again, margin_s=0)
    held.release(claim.id)
    assert not held.known_held(claim, margin_s=0)


def test_leaving_checks_the_cancellation_before_it_asks_the_fence():
    asked: list[str] = []
    cancel = cancellation.Cancellation(before_leaving=lambda: asked.append("fence"))
    cancel.leaving()
    assert asked == ["fence"]

    cancel.cancel(cancellation.Reason.SUPERSEDED)
    with pytest.raises(cancellation.Cancelled):
        cancel.leaving()
    assert asked == ["fence"]


def fenced() -> None:
    raise fence.Fenced(codes.ErrorCode.LEASE_LOST, "the lease is not known to be held")


class Server:
    """An httpx transport that records the requests it answers."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self.answer)

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, json={"id": "job-1"})


def client(server: Server, headers=dict) -> http.HttpProvider:
    return http.HttpProvider("the API", "https://api.test", 5.0, 10_000, headers=headers, transport=server.transport)


def test_a_submit_past_a_closed_fence_sends_nothing():
    server = Server()
    with pytest.raises(fence.Fenced):
        client(server).submit("jobs", cancellation.Cancellation(before_leaving=fenced), json={})
    assert server.requests == []


def test_a_submit_past_an_open_fence_is_sent_once_and_other_requests_never_ask_the_fence():
    server = Server()
    asked: list[bool] = []
    cancel = cancellation.Cancellation(before_leaving=lambda: asked.append(True))
    api = client(server)

    assert api.submit("jobs", cancel, json={"a": 1}) == {"id": "job-1"}
    api.json("GET", "jobs/job-1", cancel)

    assert [(r.method, r.url.path) for r in server.requests] == [("POST", "/jobs"), ("GET", "/jobs/job-1")]
    assert asked == [True]


def test_a_key_that_cannot_be_read_fails_a_submit_before_the_fence_records_anything():
    def unreadable() -> dict[str, str]:
        raise errors.ProviderError("provider_key_unreadable", "/run/secrets/key: No such file or directory")

    asked: list[bool] = []
    with pytest.raises(errors.ProviderError, match="provider_key_unreadable"):
        client(Server(), unreadable).submit(
            "jobs", cancellation.Cancellation(before_leaving=lambda: asked.append(True)), json={}
        )
    assert asked == []


class Listener:
    """A local HTTP server that records the requests it receives (its bytes reached it)."""

    def __init__(self) -> None:
        received: list[str] = []
        self.received = received

        class Handler(http_server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received.append(self.path)
                body = b'{"id": "job-1"}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http_server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    made = Listener()
    yield made
    made.close()


def lease_until(deadline: float, asked: list[float]) -> Callable[[], None]:
    """A fence that holds while the monotonic clock is before `deadline` (a lease by the worker's own clock)."""

    def fence_check() -> None:
        asked.append(time.monotonic())
        if time.monotonic() >= deadline:
            fenced()

    return fence_check


def test_a_connect_that_stalls_past_the_lease_sends_nothing(listener, monkeypatch):
    real_lookup = outbound._lookup

    def slow_lookup(host: str, port: int) -> list:
        time.sleep(0.5)  # a name server, a SYN or a TLS handshake taking its time: the lease runs out meanwhile
        return real_lookup(host, port)

    monkeypatch.setattr(outbound, "_lookup", slow_lookup)
    asked: list[float] = []
    cancel = cancellation.Cancellation(before_leaving=lease_until(time.monotonic() + 0.2, asked))
    api = http.HttpProvider("the API", listener.url, 5.0, 10_000, allow_private=True)
    try:
        with pytest.raises(fence.Fenced):
            api.submit("jobs", cancel, json={})
    finally:
        api.close()
    assert listener.received == []
    assert len(asked) == 1  # the fence was asked once the connection was made, not before


def test_a_submit_over_the_guarded_client_passes_the_fence_once_connected_and_is_sent_once(listener):
    asked: list[float] = []
    cancel = cancellation.Cancellation(before_leaving=lease_until(time.monotonic() + 60, asked))
    api = http.HttpProvider("the API", listener.url, 5.0, 10_000, allow_private=True)
    try:
        assert api.submit("jobs", cancel, json={}) == {"id": "job-1"}
        assert api.submit("jobs", cancel, json={}) == {"id": "job-1"}  # a kept-alive connection: fenced all the same
    finally:
        api.close()
    assert listener.received == ["/jobs", "/jobs"]
    assert len(asked) == 2
