"""Connections to RabbitMQ: one node or several of a cluster, never waiting on a dead peer.

A broker setting (`CASTAD_AMQP_URL`) holds one URL or several, comma-separated: the nodes of a
cluster. Each process tries them in an order of its own (shuffled once), so the services spread over
the nodes, and moves to the next one when its node goes. Every connection, whichever library makes it
(pika for Dramatiq and the probes, aiormq for the relay), has AMQP heartbeats and TCP keepalives with a
user timeout: a node that died without closing its sockets (a lost machine, a partition) is given up
within about `HEARTBEAT_S` and `TCP_USER_TIMEOUT_MS`, not after the kernel's two hours.
"""

from __future__ import annotations

import asyncio
import random
import socket
import urllib.parse
from typing import Any

import aiormq
import pika
from aiormq.connection import TCPTransportFactory, TLSTransportFactory

HEARTBEAT_S = 10  # AMQP heartbeat timeout asked of the broker: a silent peer is dropped after about this
CONNECT_TIMEOUT_S = 10.0  # TCP connect, TLS and AMQP handshake of one node
# TCP: keepalive probes after 10 s idle, every 5 s, 3 unanswered ones end the connection; unacknowledged
# data ends it after 20 s (keepalives alone do not cover a peer that stops acknowledging what was sent).
KEEPALIVE = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}
TCP_USER_TIMEOUT_MS = 20_000


def urls(setting: str) -> list[str]:
    """The node URLs of a broker setting, in this process's order (see the module docstring)."""
    nodes = split(setting)
    return random.sample(nodes, len(nodes))


def split(setting: str) -> list[str]:
    """The node URLs of a broker setting, as written."""
    return [part.strip() for part in setting.split(",") if part.strip()]


def pika_parameters(setting: str, *, timeout_s: float | None = None) -> list[pika.URLParameters]:
    """Connection parameters of every node, for pika's `BlockingConnection` (which tries them in turn).

    `timeout_s`: a shorter bound on connecting and on a blocked connection (probes, scrapes)."""
    return [_pika(url, timeout_s) for url in urls(setting)]


def _pika(url: str, timeout_s: float | None) -> pika.URLParameters:
    parameters = pika.URLParameters(url)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)  # what the URL sets itself wins
    if "heartbeat" not in query:
        parameters.heartbeat = HEARTBEAT_S
    if "tcp_options" not in query:
        parameters.tcp_options = {**KEEPALIVE, "TCP_USER_TIMEOUT": TCP_USER_TIMEOUT_MS}
    connect_s = min(timeout_s or CONNECT_TIMEOUT_S, CONNECT_TIMEOUT_S)
    for name in ("socket_timeout", "stack_timeout"):
        if name not in query:
            setattr(parameters, name, connect_s)
    if timeout_s is not None:
        parameters.blocked_connection_timeout = timeout_s
    parameters.connection_attempts = 1  # the next node, not the same one again
    return parameters


def blocking_connection(setting: str, *, timeout_s: float | None = None) -> pika.BlockingConnection:
    """A connection to the first node of the setting that takes one."""
    return pika.BlockingConnection(pika_parameters(setting, timeout_s=timeout_s))


async def connect(setting: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> aiormq.abc.AbstractConnection:
    """An aiormq connection to the first node of the setting that takes one; the last node's error if none.

    aiormq has no handshake timeout of its own: a node that takes the connection but never answers (a
    partition) would hold the caller for ever, so each node gets `timeout_s`."""
    error: BaseException | None = None
    for url in urls(setting):
        try:
            async with asyncio.timeout(timeout_s):
                return await aiormq.connect(_aiormq_url(url), transport_factory=_KeepaliveTransport(url))
        except (OSError, aiormq.exceptions.AMQPError, TimeoutError) as failed:
            error = failed
    assert error is not None
    raise error


def _aiormq_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    query.setdefault("heartbeat", str(HEARTBEAT_S))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


class _KeepaliveTransport(TCPTransportFactory):
    """aiormq's transport, its socket given the keepalive and user timeout options of every connection."""

    def __init__(self, url: str) -> None:
        self._inner = TLSTransportFactory() if url.startswith("amqps://") else TCPTransportFactory()

    async def create(self, url: Any, **kwargs: Any) -> Any:
        reader, writer = await self._inner.create(url, **kwargs)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            set_keepalive(sock)
        return reader, writer


def set_keepalive(sock: socket.socket) -> None:
    """Keepalives and a user timeout on a connected TCP socket (Linux's options; others skip what they lack)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in {**KEEPALIVE, "TCP_USER_TIMEOUT": TCP_USER_TIMEOUT_MS}.items():
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
