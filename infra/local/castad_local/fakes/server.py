"""The HTTP plumbing every fake provider shares: a threaded server on 127.0.0.1 and small
request and response values, so that a fake is only its `handle` method."""

from __future__ import annotations

import abc
import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclasses.dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of_json(cls, status: int, data: Any, headers: dict[str, str] | None = None) -> Response:
        body = json.dumps(data, ensure_ascii=False).encode()
        return cls(status, body, {"content-type": "application/json", **(headers or {})})


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
                response = fake.handle(request)
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
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._server.server_port}"

    @abc.abstractmethod
    def handle(self, request: Request) -> Response:
        """The answer to one request (each fake's behaviour)."""

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
