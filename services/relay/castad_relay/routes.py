"""Every queue that must take an event is bound to its type before one is published.

The broker confirms an event once any queue took it: the gateway's queue takes every stage's facts, so an event
published before, say, the song service first bound its queue is confirmed, marked published and never reaches
the song stage. That happens whenever a service starts after its producers without set-up having declared the
whole topology first (a service run on its own, a chart installed or a pod ready later).

So before the first event of a type goes out, the relay binds that type's patterns to each queue that takes it
(`topology.subscribers`, from the contracts it ships with), which is idempotent, and again every `recheck_s`
and after each new connection (a queue deleted meanwhile). A queue that does not exist yet cannot be bound: the
relay then holds the event, uncharged, and tries again until the queue's service or set-up declares it. A relay
whose broker user may not bind (set up by an earlier release) publishes unchecked, as before, and says so once.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiormq
from castad_contracts import topology

log = logging.getLogger(__name__)

RECHECK_S = 60.0
BIND_TIMEOUT_S = 5.0


class Routes:
    def __init__(self, topo: topology.Topology, recheck_s: float = RECHECK_S) -> None:
        self.topology = topo
        self.recheck_s = recheck_s
        self.unchecked = False  # the broker user may not bind: events go out unchecked
        self._bound_at: dict[str, float] = {}  # routing key -> when each queue taking it was last bound to it
        self._missing: set[str] = set()  # queues found missing, until they exist
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """Bind again before the next publish of each type (a new connection: the broker may have lost queues)."""
        self._bound_at.clear()

    async def missing(self, connection: aiormq.abc.AbstractConnection, routing_key: str) -> str | None:
        """The first queue that must take events of `routing_key` and does not exist; None once each is bound.

        Raises what the broker connection raises (trouble with the broker, not with the row)."""
        if self.unchecked or time.monotonic() - self._bound_at.get(routing_key, -self.recheck_s) < self.recheck_s:
            return None
        async with self._lock:  # the rows of many pipelines ask at once: one binds, the others find it bound
            if time.monotonic() - self._bound_at.get(routing_key, -self.recheck_s) < self.recheck_s:
                return None
            for service, patterns in topology.subscribers(routing_key).items():
                queue = self.topology.queue(service)
                if not await self._bind(connection, queue, patterns):
                    if queue not in self._missing:
                        self._missing.add(queue)
                        log.warning(
                            "events of type %s wait until queue %s exists: start the %s service, or declare the"
                            " topology (castad-admin topology)",
                            routing_key,
                            queue,
                            service,
                        )
                    return queue
                if queue in self._missing:
                    self._missing.discard(queue)
                    log.info("queue %s exists and is bound: the events that waited for it go out", queue)
            if not self.unchecked:
                self._bound_at[routing_key] = time.monotonic()
            return None

    async def _bind(self, connection: aiormq.abc.AbstractConnection, queue: str, patterns: tuple[str, ...]) -> bool:
        """Bind `queue` to each pattern; False if the queue does not exist (the broker closes the channel)."""
        async with asyncio.timeout(BIND_TIMEOUT_S):
            channel = await connection.channel()
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
        finally:
            if not channel.is_closed:
                await channel.close()
        return True
