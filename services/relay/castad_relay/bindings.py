"""Every queue that must take an event is bound to its type before one is published.

The broker confirms an event once any queue took it: the gateway's queue takes every stage's facts, so an event
published before, say, the song service first bound its queue is confirmed, marked published and never reaches
the song stage. That happens whenever a service starts after its producers without set-up having declared the
whole topology first (a service run on its own, a chart installed or a pod ready later).

So before an event of a type goes out, the relay binds that type's patterns to each queue that takes it
(`topology.subscribers`, from the contracts it ships with), which is idempotent: once, then again every
`recheck_s` and after each new connection (a queue deleted and declared again meanwhile). A queue that does not
exist yet cannot be bound: the relay then holds the events that queue must take, uncharged, and looks again
`retry_s` later, until the queue's service or set-up declares it. A relay whose broker user may not bind (users set
up by an earlier release) publishes unchecked, as before, says so once, and tries again on its next connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aiormq
from castad_contracts import topology

log = logging.getLogger(__name__)

RECHECK_S = 5.0
BIND_TIMEOUT_S = 5.0


class Bindings:
    def __init__(self, topo: topology.Topology, retry_s: float, recheck_s: float = RECHECK_S) -> None:
        self.topology = topo
        self.retry_s = retry_s  # how soon a queue found missing is looked for again
        self.recheck_s = recheck_s
        self.unchecked = False  # the broker user may not bind: events go out unchecked until the next connection
        self._bound_at: dict[str, float] = {}  # routing key -> when each queue taking it was last bound to it
        self._missing: dict[str, tuple[str, float]] = {}  # routing key -> the queue found missing, and when
        self._said_missing: set[str] = set()  # queues found missing, said once until they exist
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """Bind again before the next publish of each type (a new connection: the broker may have lost queues)."""
        self._bound_at.clear()
        self._missing.clear()
        self.unchecked = False

    async def missing(self, connection: aiormq.abc.AbstractConnection, routing_key: str) -> str | None:
        """The first queue that must take events of `routing_key` and does not exist; None once each is bound.

        Raises ConnectionError, TimeoutError or an AMQP error on trouble with the broker (not the row's)."""
        if self._looked_lately(routing_key):
            return self._found_missing(routing_key)
        async with self._lock:  # the rows of many pipelines ask at once: one binds, the others find it looked at
            if self._looked_lately(routing_key):
                return self._found_missing(routing_key)
            for service, patterns in topology.subscribers(routing_key).items():
                queue = self.topology.queue(service)
                if not await self._bind(connection, queue, patterns):
                    self._missing[routing_key] = (queue, time.monotonic())
                    if queue not in self._said_missing:
                        self._said_missing.add(queue)
                        log.warning(
                            "events of type %s wait until queue %s exists: start the %s service, or declare the"
                            " topology (castad-admin topology)",
                            routing_key,
                            queue,
                            service,
                        )
                    return queue
                if queue in self._said_missing:
                    self._said_missing.discard(queue)
                    log.info("queue %s exists and is bound: the events that waited for it go out", queue)
                if self.unchecked:
                    return None
            self._missing.pop(routing_key, None)
            self._bound_at[routing_key] = time.monotonic()
            return None

    def _looked_lately(self, routing_key: str) -> bool:
        """Whether `routing_key`'s queues were bound within `recheck_s`, or one found missing within `retry_s`."""
        now = time.monotonic()
        if self.unchecked or now - self._bound_at.get(routing_key, -self.recheck_s) < self.recheck_s:
            return True
        found = self._missing.get(routing_key)
        return found is not None and now - found[1] < self.retry_s

    def _found_missing(self, routing_key: str) -> str | None:
        """The queue the last look found missing (None: each was bound, or the look is not allowed)."""
        found = self._missing.get(routing_key)
        return None if self.unchecked or found is None else found[0]

    async def _bind(self, connection: aiormq.abc.AbstractConnection, queue: str, patterns: tuple[str, ...]) -> bool:
        """Bind `queue` to each pattern; False if the queue does not exist (the broker closes the channel)."""
        try:
            async with asyncio.timeout(BIND_TIMEOUT_S):
                channel = await connection.channel(publisher_confirms=False)
        except RuntimeError as error:  # aiormq's word for a connection closed meanwhile
            raise ConnectionError(str(error)) from error
        try:
            for pattern in patterns:
                await channel.queue_bind(queue, self.topology.exchange, routing_key=pattern, timeout=BIND_TIMEOUT_S)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        except aiormq.exceptions.ChannelAccessRefused as error:
            self.unchecked = True
            log.error(
                "the relay's broker user may not bind queues (%s): events are published without checking that"
                " every queue taking them exists, and one published before its consumer's queue is bound reaches"
                " only the other queues; grant the relay's permissions again (castad-admin privileges)",
                error,
            )
            return True
        except asyncio.CancelledError as error:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # the relay stops
                raise
            raise ConnectionError("the connection died while binding") from error  # aiormq cancels its waiters
        finally:
            if not channel.is_closed:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(BIND_TIMEOUT_S):
                        await channel.close()
        return True
