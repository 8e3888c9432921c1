"""The relay's connections: to RabbitMQ, and to a service's database.

To RabbitMQ: the first node of the broker setting that answers, with heartbeats and TCP keepalives as every
connection of Castad has them (castad_runtime.amqp). To a database: a session that resolves names in PostgreSQL's
own catalog only and carries the relay's session limits (castad_relay.statements).
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import aiormq
import psycopg
from aiormq.connection import TCPTransportFactory, TLSTransportFactory
from castad_runtime import amqp, db

from castad_relay import statements


async def database(url: str, sessions: db.SessionLimits) -> psycopg.AsyncConnection[Any]:
    """An autocommit session of the database at `url`, names pinned to pg_catalog, the session limits set.

    A caller's timeout or stop may cancel it between connecting and returning: the session is closed then, not
    left to the garbage collector."""
    conn = await psycopg.AsyncConnection.connect(**db.connect_kwargs(url), autocommit=True)
    try:
        await conn.execute(statements.PINNED)
        await conn.execute(sessions.statement())
    except BaseException:
        await conn.close()
        raise
    return conn


async def connect(setting: str, *, timeout_s: float = amqp.CONNECT_TIMEOUT_S) -> aiormq.abc.AbstractConnection:
    """An aiormq connection to the first node of the setting that takes one; the last node's error if none.

    aiormq has no handshake timeout of its own: a node that takes the connection but never answers (a
    partition) would hold the caller for ever, so each node gets `timeout_s`."""
    error: BaseException | None = None
    for url in amqp.urls(setting):
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
    query.setdefault("heartbeat", str(amqp.HEARTBEAT_S))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


class _KeepaliveTransport(TCPTransportFactory):
    """aiormq's transport, its socket given the keepalive and user timeout options of every connection."""

    def __init__(self, url: str) -> None:
        self._inner = TLSTransportFactory() if url.startswith("amqps://") else TCPTransportFactory()

    async def create(self, url: Any, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self._inner.create(url, **kwargs)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            amqp.set_keepalive(sock)
        return reader, writer
