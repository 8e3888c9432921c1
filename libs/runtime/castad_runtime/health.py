"""Liveness and readiness of a service, and the HTTP server that answers a worker's probes.

The small server also answers, given a registry, Prometheus's scrapes of `/metrics`.

Liveness says the process is working: its own threads run and its loop answers. It never
looks at the database or the broker, so an outage of either (which the service rides out
by itself) never gets a pod restarted. Readiness says the service can reach what it needs
right now; it turns false while the service stops, too.

Each check returns "ok" or a short reason; `/healthz` and `/readyz` answer 200 when every
check says "ok" and 503 with the reasons otherwise. Where probes may come often or from anyone
(the gateway's), readiness is `cached` and checks on connections kept for it (`pooled_database`,
`KeptBroker`), so that no probe opens a connection of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping

import pika
import pika.exceptions
import psycopg
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from castad_runtime import amqp, db, metrics

log = logging.getLogger(__name__)

OK = "ok"
TIMEOUT_S = 2
CACHE_S = 1.5  # a cached check answers from its last run this long
CHECKING = "checking"  # the first run of a cached check has not answered yet
Check = Callable[[], str]


def database(url: str) -> Check:
    """Check that the database at `url` takes a connection and answers a query.

    Where `url` names several hosts, the one checked is the host that takes writes.
    """
    parameters = {**db.connect_kwargs(url), "connect_timeout": TIMEOUT_S}

    def check() -> str:
        try:
            with psycopg.connect(**parameters) as conn:
                conn.execute("SELECT 1")
            return OK
        except psycopg.Error as error:
            return f"unreachable: {type(error).__name__}"

    return check


def rabbitmq(url: str) -> Check:
    """RabbitMQ at `url` (a node of it, where it names several) accepts a connection."""

    def check() -> str:
        try:
            amqp.blocking_connection(url, timeout_s=TIMEOUT_S).close()
            return OK
        except pika.exceptions.AMQPError as error:
            return f"unreachable: {type(error).__name__}"

    return check


def pooled_database(engine: sa.Engine) -> Check:
    """The database answers a query on a connection of `engine`'s pool (one is opened only when none is there)."""

    def check() -> str:
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            return OK
        except (sa.exc.SQLAlchemyError, psycopg.Error) as error:
            return f"unreachable: {type(getattr(error, 'orig', None) or error).__name__}"

    return check


class KeptBroker:
    """RabbitMQ at `url` answers on a connection kept for these checks.

    Each opens and closes a channel on it (a round trip that also services its heartbeats); a new connection only
    when the kept one is gone. A kept one found dead (the broker closed it while no probe came to answer its
    heartbeats) is replaced at once, so only a broker that refuses a new one too is unreachable.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._connection: pika.BlockingConnection | None = None
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:  # a BlockingConnection is not for two threads at once
            kept = self._connection is not None and self._connection.is_open
            try:
                return self._answer()
            except pika.exceptions.AMQPError as error:
                self._drop()
                if not kept:
                    return f"unreachable: {type(error).__name__}"
            try:
                return self._answer()
            except pika.exceptions.AMQPError as error:
                self._drop()
                return f"unreachable: {type(error).__name__}"

    def _answer(self) -> str:
        if self._connection is None or not self._connection.is_open:
            self._connection = amqp.blocking_connection(self.url, timeout_s=TIMEOUT_S)
        self._connection.channel().close()
        return OK

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()


def cached(check: Check, ttl_s: float = CACHE_S, clock: Callable[[], float] = time.monotonic) -> Check:
    """`check`, run at most once per `ttl_s`.

    A probe within that time gets its last answer, and so does one that comes while it runs (no probe waits behind
    another; before the first answer: CHECKING).
    """
    lock = threading.Lock()
    last: dict[str, object] = {"answer": CHECKING, "at": None}

    def run() -> str:
        at = last["at"]
        if isinstance(at, float) and clock() - at < ttl_s:
            return str(last["answer"])
        if not lock.acquire(blocking=False):
            return str(last["answer"])
        try:
            started = clock()
            try:
                answer = check()
            except Exception as error:  # a probe answers; what broke is the answer
                answer = f"check failed: {type(error).__name__}"
            last.update(answer=answer, at=started)
            return answer
        finally:
            lock.release()

    return run


def threads_alive(threads: Callable[[], list[threading.Thread]]) -> Check:
    """Every thread that `threads()` lists is running (none died of an unexpected error)."""

    def check() -> str:
        listed = threads()
        dead = sorted({thread.name for thread in listed if not thread.is_alive()})
        if not listed:
            return "not started"
        return OK if not dead else f"stopped: {', '.join(dead)}"

    return check


def loop_responsive(loop: asyncio.AbstractEventLoop) -> Check:
    """The asyncio loop runs a callback within the probe's time (nothing blocks it)."""

    def check() -> str:
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError as error:  # the loop is closed
            return f"stopped: {error}"
        return OK if answered.wait(TIMEOUT_S) else f"no answer within {TIMEOUT_S} s"

    return check


def run_checks(checks: Mapping[str, Check]) -> tuple[bool, dict[str, str]]:
    results = {}
    for name, check in checks.items():
        try:
            results[name] = check()
        except Exception as error:  # a probe answers; what broke is the answer
            results[name] = f"check failed: {type(error).__name__}"
    return all(result == OK for result in results.values()), results


class ProbeServer:
    """Serve `/healthz`, `/readyz` and, with a registry, `/metrics` over HTTP on a thread of its own.

    `/healthz` is liveness (and names the `release` that runs, when given), `/readyz` readiness. A thread per
    request: a slow scrape holds up no probe.
    """

    def __init__(
        self,
        port: int,
        liveness: Mapping[str, Check],
        readiness: Mapping[str, Check],
        registry: CollectorRegistry | None = None,
        release: str | None = None,
    ) -> None:
        self.port = port
        self.release = release
        self.liveness = liveness
        self.readiness = readiness
        self.registry = registry
        self.stopping = threading.Event()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        probes = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path == "/metrics" and probes.registry is not None:
                    payload, content_type = metrics.exposition(probes.registry, self.headers.get("Accept"))
                    self._send(200, content_type, payload)
                    return
                status, body = probes.answer(self.path)
                self._send(status, "application/json", json.dumps(body).encode())

            def _send(self, status: int, content_type: str, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
                pass

        self._server = http.server.ThreadingHTTPServer(("0.0.0.0", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="probes", daemon=True)
        self._thread.start()
        log.info("probes on port %d: /healthz, /readyz%s", self.port, ", /metrics" if self.registry else "")

    def answer(self, path: str) -> tuple[int, dict[str, object]]:
        if path == "/healthz":
            alive, checks = run_checks(self.liveness)
            named = {"release": self.release} if self.release is not None else {}
            return (200 if alive else 503), {"status": "ok" if alive else "failing", **named, "checks": checks}
        if path == "/readyz":
            if self.stopping.is_set():
                return 503, {"status": "stopping", "checks": {}}
            ready, checks = run_checks(self.readiness)
            return (200 if ready else 503), {"status": "ready" if ready else "unavailable", "checks": checks}
        known = "/healthz, /readyz or /metrics" if self.registry is not None else "/healthz or /readyz"
        return 404, {"detail": f"not found: try {known}"}

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
