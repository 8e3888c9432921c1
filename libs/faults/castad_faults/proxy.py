"""A TCP proxy on 127.0.0.1 that a test can cut, hold and restore, to fake a broker outage.

The shared RabbitMQ keeps running for every other test; only the connections that go
through the proxy see the outage. One thread owns every socket (a selector loop), so
cutting never races with forwarding.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import urllib.parse
from collections.abc import Iterator

_CHUNK = 65536


class TcpProxy:
    """Forwards connections from `port` to `target`.

    - `cut()`: closes every forwarded connection and refuses new ones (reset at once);
    - `hold()`: keeps connections open but stops passing bytes from the target back to
      the clients (a broker that received a publish but whose confirm is not delivered);
    - `blackhole()`: a network partition: bytes on open connections and on new ones are dropped
      silently, nothing is closed; connections made during it stay dead after `restore()`;
    - `restore()`: back to normal.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._upstream: set[socket.socket] = set()
        self._dead: set[socket.socket] = set()
        self._commands: list[tuple[str, threading.Event]] = []
        self._lock = threading.Lock()
        self._mode = "open"
        self._stopping = threading.Event()
        self.refused = 0
        self.swallowed = 0
        self._thread = threading.Thread(target=self._loop, name="tcp-proxy", daemon=True)

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        for sock in list(self._peers) + list(self._dead):
            self._close(sock)
        self._selector.close()
        self._listener.close()

    def cut(self) -> None:
        self._command("cut")

    def hold(self) -> None:
        self._command("hold")

    def blackhole(self) -> None:
        self._command("blackhole")

    def restore(self) -> None:
        self._command("open")

    def _command(self, mode: str) -> None:
        done = threading.Event()
        with self._lock:
            self._commands.append((mode, done))
        if not done.wait(timeout=5):
            raise RuntimeError(f"proxy did not switch to {mode!r}")

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._apply_commands()
            for key, _ in self._selector.select(timeout=0.02):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept()
                elif sock in self._peers or sock in self._dead:
                    self._forward(sock)

    def _apply_commands(self) -> None:
        with self._lock:
            commands, self._commands = self._commands, []
        for mode, done in commands:
            if mode == "cut":
                for sock in list(self._peers):
                    self._close(sock)
            if mode == "blackhole":
                self._dead.update(self._peers)
            if self._mode == "hold" and mode != "hold":
                for sock in self._upstream:
                    self._selector.register(sock, selectors.EVENT_READ)
            if mode == "hold" and self._mode != "hold":
                for sock in self._upstream:
                    self._selector.unregister(sock)
            self._mode = mode
            done.set()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        if self._mode == "cut":
            self.refused += 1
            _reset(client)
            return
        if self._mode == "blackhole":
            self.swallowed += 1
            client.setblocking(True)
            self._dead.add(client)
            self._selector.register(client, selectors.EVENT_READ)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _reset(client)
            return
        for sock in (client, upstream):
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._peers[client] = upstream
            self._peers[upstream] = client
            self._upstream.add(upstream)
        self._selector.register(client, selectors.EVENT_READ)
        if self._mode != "hold":
            self._selector.register(upstream, selectors.EVENT_READ)

    def _forward(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(_CHUNK)
            if data:
                if sock not in self._dead:
                    self._peers[sock].sendall(data)
                return
        except OSError:
            pass
        self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        """Close a connection from both ends."""
        with self._lock:
            peer = self._peers.pop(sock, None)
            pair = (sock,) if peer is None else (sock, peer)
            for each in pair:
                self._peers.pop(each, None)
                self._upstream.discard(each)
                self._dead.discard(each)
        for each in pair:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(each)
            _reset(each)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset, as a dead broker or a refused connection looks to a client."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def address_of(amqp_url: str) -> tuple[str, int]:
    """Host and port of a broker URL."""
    parts = urllib.parse.urlsplit(amqp_url)
    return parts.hostname or "127.0.0.1", parts.port or 5672


def through(amqp_url: str, port: int) -> str:
    """The same broker URL through a proxy on 127.0.0.1:`port`."""
    parts = urllib.parse.urlsplit(amqp_url)
    credentials = parts.netloc.rpartition("@")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{credentials}@127.0.0.1:{port}"))


@contextlib.contextmanager
def running_proxy(target: tuple[str, int]) -> Iterator[TcpProxy]:
    proxy = TcpProxy(target).start()
    try:
        yield proxy
    finally:
        proxy.stop()
