"""The plumbing every fake provider shares: a threaded server on 127.0.0.1 and small request and
response values, so that a fake is mostly its `handle` method; a `Script` of replies a test queues
for the next requests, with the answers to the kinds every fake knows; and `Callbacks`, the one
background thread that posts a fake's callbacks (webhooks) when they fall due."""

from __future__ import annotations

import abc
import collections
import dataclasses
import heapq
import itertools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Self, TypeVar

import httpx

JSON = "application/json"
KEEP = 10_000  # requests and callbacks remembered for `GET /_fake/...`


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")

    def record(self) -> dict[str, Any]:
        """What `GET /_fake/requests` shows of it: method, path, query and the body as JSON (or text)."""
        try:
            body = self.json()
        except ValueError:
            body = self.body.decode(errors="replace")
        return {"method": self.method, "path": self.path, "query": self.query, "body": body}


@dataclasses.dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of_json(cls, status: int, data: Any, headers: dict[str, str] | None = None) -> Response:
        body = json.dumps(data, ensure_ascii=False).encode()
        return cls(status, body, {"content-type": JSON, **(headers or {})})


@dataclasses.dataclass(frozen=True)
class Reply:
    """One scripted answer. The kinds every fake knows: ok, status (an HTTP error, with `retry_after`
    as its Retry-After header), hang (`seconds`, then as ok), malformed (cut-off JSON), oversized
    (a body of `size` bytes). A fake may add kinds and fields in a subclass."""

    kind: str = "ok"
    status: int = 200
    retry_after: str | None = None
    seconds: float = 0.0
    size: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(**data)


GENERIC_KINDS = frozenset({"ok", "status", "hang", "malformed", "oversized"})
R = TypeVar("R", bound=Reply)


class Script(Generic[R]):
    """The replies queued for the next API requests (one each, then ok) and the requests received.

    It answers `POST /_fake/script` (a JSON list of replies) and `GET /_fake/requests` itself.
    """

    def __init__(self, reply: type[R], kinds: Iterable[str] = GENERIC_KINDS, keep: int = KEEP) -> None:
        self._reply = reply
        self._kinds = frozenset(kinds)
        self._queue: collections.deque[R] = collections.deque()
        self._received: collections.deque[Any] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()

    def add(self, *replies: R) -> None:
        unknown = {reply.kind for reply in replies} - self._kinds
        if unknown:
            raise ValueError(f"unknown reply kinds {sorted(unknown)}; known: {sorted(self._kinds)}")
        with self._lock:
            self._queue.extend(replies)

    def next(self, received: Any) -> R:
        """Records a request and takes the reply scripted for it (ok when none is)."""
        with self._lock:
            self._received.append(received)
            return self._queue.popleft() if self._queue else self._reply()

    def received(self) -> list[Any]:
        with self._lock:
            return list(self._received)

    def serve(self, request: Request) -> Response | None:
        """The answer to the script's own paths, None for any other request."""
        if request.path == "/_fake/script" and request.method == "POST":
            try:
                self.add(*(self._reply.from_json(item) for item in request.json()))
            except (ValueError, TypeError) as error:
                return Response.of_json(400, {"error": f"bad script: {error}"})
            return Response(204)
        if request.path == "/_fake/requests" and request.method == "GET":
            return Response.of_json(200, self.received())
        return None


def phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def answer(
    reply: Reply,
    normal: Callable[[], Response],
    error: Callable[[int], Response],
    malformed: bytes = b'{"data": {',
) -> Response:
    """The answer to a reply of a generic kind: `normal()` for ok, after a hang, or padded when
    oversized; `error(status)` with Retry-After for status; `malformed` for malformed."""
    if reply.kind == "hang":
        time.sleep(reply.seconds)
    if reply.kind == "status":
        response = error(reply.status)
        retry = {"retry-after": reply.retry_after} if reply.retry_after else {}
        return Response(response.status, response.body, {**response.headers, **retry})
    if reply.kind == "malformed":
        return Response(200, malformed, {"content-type": JSON})
    response = normal()
    return padded(response, reply.size) if reply.kind == "oversized" else response


def padded(response: Response, size: int) -> Response:
    """The same JSON object with a `padding` string that makes the body `size` bytes (or a little more)."""
    data = json.loads(response.body)
    base = len(json.dumps({**data, "padding": ""}, ensure_ascii=False).encode())
    return Response.of_json(response.status, {**data, "padding": "x" * max(0, size - base)})


class Callbacks:
    """Posts JSON to callback URLs when they fall due, all from one background thread, and keeps a
    record of each sent (`GET /_fake/callbacks`). A failing target is recorded, never raised."""

    def __init__(self, timeout_s: float = 5.0, keep: int = KEEP) -> None:
        self.timeout_s = timeout_s
        self._due: list[tuple[float, int, str, dict[str, Any], Callable[[], Any]]] = []
        self._order = itertools.count()
        self._sent: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def at(self, due: float, url: str, label: dict[str, Any], payload: Callable[[], Any]) -> None:
        """Posts `payload()` to `url` at `due` (time.monotonic); `label` goes into the record."""
        with self._wake:
            if self._closed:
                return
            heapq.heappush(self._due, (due, next(self._order), url, label, payload))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fake-callbacks", daemon=True)
                self._thread.start()
            self._wake.notify()

    def sent(self) -> list[dict[str, Any]]:
        with self._wake:
            return list(self._sent)

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._due.clear()
            self._wake.notify()

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while (item := self._next()) is not None:
                _, _, url, label, payload = item
                record = {"url": url, **label, "status": None, "error": None}
                try:
                    record["status"] = client.post(url, json=payload()).status_code
                except Exception as error:  # any failure of the target is only recorded
                    record["error"] = f"{type(error).__name__}: {error}"
                with self._wake:
                    self._sent.append(record)

    def _next(self) -> tuple[float, int, str, dict[str, Any], Callable[[], Any]] | None:
        with self._wake:
            while not self._closed:
                wait = self._due[0][0] - time.monotonic() if self._due else None
                if wait is not None and wait <= 0:
                    return heapq.heappop(self._due)
                self._wake.wait(wait)
            return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many pipelines poll at once; the default backlog of 5 drops connections

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a caller hanging up is no error of the fake's
            super().handle_error(request, client_address)


class FakeServer(abc.ABC):
    """Serves `handle` on host:port (0: a free port) until `stop`; usable as a context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                path, _, query = self.path.partition("?")
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = Request(self.command, path, query, headers, self.rfile.read(length))
                with fake._answering:
                    fake._in_flight += 1
                try:
                    response = fake.handle(request)
                finally:
                    with fake._answering:
                        fake._in_flight -= 1
                        fake._answering.notify_all()
                try:
                    self.send_response(response.status)
                    for name, value in response.headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(response.body)))
                    self.end_headers()
                    self.wfile.write(response.body)
                except (BrokenPipeError, ConnectionResetError):  # the caller gave up waiting
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read what they need
                pass

        self._host = host
        self._server = _Server((host, port), Handler)
        self._answering = threading.Condition()
        self._in_flight = 0
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._server.server_port}"

    @abc.abstractmethod
    def handle(self, request: Request) -> Response:
        """The answer to one request (each fake's behaviour)."""

    def idle(self, within_s: float = 10.0) -> bool:
        """Whether every request received has been handled (within `within_s`): a hung answer a caller gave up on
        still goes on, and what it does (a task made, a plan taken) must not fall into what comes next."""
        with self._answering:
            return self._answering.wait_for(lambda: self._in_flight == 0, within_s)

    def start(self) -> FakeServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
