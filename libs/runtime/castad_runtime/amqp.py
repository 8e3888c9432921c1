"""Connections to RabbitMQ: one node or several of a cluster, never waiting on a dead peer.

A broker setting (`CASTAD_AMQP_URL`) holds one URL or several, comma-separated: the nodes of a
cluster. Each connection tries them in an order drawn anew (so the services spread over the nodes, and
a dead node is not always tried first) and moves to the next one when its node goes. Every connection,
whichever library makes it (pika for Dramatiq and the probes, aiormq for the relay), has AMQP
heartbeats and TCP keepalives with a user timeout: a node that died without closing its sockets (a lost
machine, a partition) is given up within about two heartbeats or `TCP_USER_TIMEOUT_MS`, not after the
kernel's two hours. What a URL sets itself (`heartbeat`, `tcp_options`, timeouts, `connection_attempts`)
wins. (The relay's asyncio connections are made in castad_relay.connection, with these same settings.)
"""

from __future__ import annotations

import random
import socket
import urllib.parse

import pika

HEARTBEAT_S = 5  # AMQP heartbeat timeout asked of the broker: a silent peer is dropped after about two
CONNECT_TIMEOUT_S = 10.0  # TCP connect, TLS and AMQP handshake of one node
# TCP: keepalive probes after 5 s idle, every 2 s, 3 unanswered ones end the connection; unacknowledged
# data ends it after 10 s (keepalives alone do not cover a peer that stops acknowledging what was sent).
KEEPALIVE = {"TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 3}
TCP_USER_TIMEOUT_MS = 10_000


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
    parameters.tcp_options = {**KEEPALIVE, "TCP_USER_TIMEOUT": TCP_USER_TIMEOUT_MS, **(parameters.tcp_options or {})}
    connect_s = min(timeout_s or CONNECT_TIMEOUT_S, CONNECT_TIMEOUT_S)
    for name in ("socket_timeout", "stack_timeout"):
        if name not in query:
            setattr(parameters, name, connect_s)
    if timeout_s is not None and "blocked_connection_timeout" not in query:
        parameters.blocked_connection_timeout = timeout_s
    if "connection_attempts" not in query:
        parameters.connection_attempts = 1  # the next node, not the same one again
    return parameters


def blocking_connection(setting: str, *, timeout_s: float | None = None) -> pika.BlockingConnection:
    """A connection to the first node of the setting that takes one."""
    return pika.BlockingConnection(pika_parameters(setting, timeout_s=timeout_s))


def set_keepalive(sock: socket.socket) -> None:
    """Keepalives and a user timeout on a connected TCP socket (Linux's options; others skip what they lack)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in {**KEEPALIVE, "TCP_USER_TIMEOUT": TCP_USER_TIMEOUT_MS}.items():
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
