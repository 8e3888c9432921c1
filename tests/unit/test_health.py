"""The probe server of workers: liveness never depends on the database, readiness turns off on stop."""

from __future__ import annotations

import asyncio
import threading
import types

import httpx
import pika.exceptions
import pytest
from castad_local import stack
from castad_runtime import amqp, health


def _get(port: int, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)


@pytest.fixture
def port() -> int:
    return stack.free_port()


def test_probes_answer_with_every_check_and_turn_unready_on_stop(port):
    state = {"database": "ok"}
    probes = health.ProbeServer(
        port,
        liveness={"worker": lambda: health.OK},
        readiness={"database": lambda: state["database"], "rabbitmq": lambda: health.OK},
        release="1.2.3",
    )
    probes.start()
    try:
        assert _get(port, "/healthz").json() == {"status": "ok", "release": "1.2.3", "checks": {"worker": "ok"}}
        ready = _get(port, "/readyz")
        assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "rabbitmq": "ok"}

        state["database"] = "unreachable: OperationalError"
        unready = _get(port, "/readyz")
        assert unready.status_code == 503
        assert unready.json() == {
            "status": "unavailable",
            "checks": {"database": "unreachable: OperationalError", "rabbitmq": "ok"},
        }
        assert _get(port, "/healthz").status_code == 200, "an outage must not fail liveness"

        assert _get(port, "/metrics").status_code == 404
        probes.stopping.set()
        assert _get(port, "/readyz").json()["status"] == "stopping"
    finally:
        probes.stop()
    with pytest.raises(httpx.ConnectError):
        _get(port, "/healthz")


def test_a_check_that_raises_is_reported_not_propagated(port):
    def broken() -> str:
        raise ValueError("boom")

    probes = health.ProbeServer(port, liveness={"broken": broken}, readiness={})
    probes.start()
    try:
        answer = _get(port, "/healthz")
        assert answer.status_code == 503
        assert answer.json()["checks"] == {"broken": "check failed: ValueError"}
    finally:
        probes.stop()


def test_threads_alive_names_the_dead_thread():
    done = threading.Thread(target=lambda: None, name="scheduler")
    done.start()
    done.join()
    running = threading.Event()
    alive = threading.Thread(target=running.wait, name="consumer")
    alive.start()
    try:
        assert health.threads_alive(lambda: [])() == "not started"
        assert health.threads_alive(lambda: [alive])() == health.OK
        assert health.threads_alive(lambda: [alive, done])() == "stopped: scheduler"
    finally:
        running.set()
        alive.join()


def test_loop_responsive_tells_a_blocked_loop_from_a_free_one():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        check = health.loop_responsive(loop)
        assert check() == health.OK
        release = threading.Event()
        loop.call_soon_threadsafe(release.wait)  # blocks the loop, as a synchronous call in a coroutine would
        assert check().startswith("no answer within")
        release.set()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert check().startswith("stopped")


def test_unreachable_servers_are_reported_as_such():
    assert health.database("postgresql://postgres@127.0.0.1:1/none")().startswith("unreachable")
    assert health.rabbitmq("amqp://guest:guest@127.0.0.1:1/%2F")().startswith("unreachable")


def test_a_cached_check_runs_once_a_while_and_a_probe_never_waits_behind_a_running_one():
    now = [100.0]
    runs: list[float] = []
    release = threading.Event()

    def slow() -> str:
        runs.append(now[0])
        release.wait(5)
        return health.OK

    check = health.cached(slow, ttl_s=1.5, clock=lambda: now[0])
    first = threading.Thread(target=check)
    first.start()
    while not runs:
        threading.Event().wait(0.01)
    assert check() == "checking"  # the first run has no answer yet: the probe does not wait for it
    release.set()
    first.join()
    assert check() == health.OK and len(runs) == 1  # within its time: the last answer
    now[0] += 2
    assert check() == health.OK and len(runs) == 2


def test_a_kept_broker_connection_found_dead_is_replaced_at_once(monkeypatch):
    class Dead:
        is_open = True

        def channel(self):
            raise pika.exceptions.StreamLostError("the broker closed it while nobody answered its heartbeats")

        def close(self):
            pass

    class Alive:
        is_open = True

        def channel(self):
            return types.SimpleNamespace(close=lambda: None)

    made = []
    monkeypatch.setattr(amqp, "blocking_connection", lambda url, timeout_s: made.append(url) or Alive())
    check = health.KeptBroker("amqp://broker")
    check._connection = Dead()  # kept from an earlier probe

    assert check() == health.OK and made == ["amqp://broker"]
    assert check() == health.OK and made == ["amqp://broker"]  # kept again
