"""The relay binds each queue that takes a type before the type's first event, then again beside the publishes.

A fake connection stands for the broker: it counts the binds and can say a queue does not exist (as the broker
closes the channel with NOT_FOUND).
"""

from __future__ import annotations

import asyncio

import aiormq
from castad_contracts import topology
from castad_relay import bindings

TOPOLOGY = topology.Topology("castad")
SONG_QUEUE = TOPOLOGY.queue("song")


class FakeChannel:
    def __init__(self, connection: FakeConnection) -> None:
        self.connection, self.is_closed = connection, False

    async def queue_bind(self, queue: str, exchange: str, routing_key: str, timeout: float) -> None:
        await asyncio.sleep(0)
        if queue in self.connection.absent:
            raise aiormq.exceptions.ChannelNotFoundEntity(f"no queue '{queue}'")
        self.connection.bound.append(queue)

    async def close(self) -> None:
        self.is_closed = True


class FakeConnection:
    def __init__(self) -> None:
        self.bound: list[str] = []
        self.absent: set[str] = set()

    async def channel(self, publisher_confirms: bool) -> FakeChannel:
        return FakeChannel(self)


def test_a_type_is_bound_before_its_first_event_then_again_beside_the_publishes_once_its_recheck_is_due():
    async def run() -> None:
        connection = FakeConnection()
        bind = bindings.Bindings(TOPOLOGY, retry_s=0.05, recheck_s=0.05)

        assert await bind.missing(connection, "lyric.completed") is None  # type: ignore[arg-type]
        first = len(connection.bound)
        assert SONG_QUEUE in connection.bound  # bound before the first event goes out
        assert await bind.missing(connection, "lyric.completed") is None  # type: ignore[arg-type]
        assert len(connection.bound) == first  # looked at lately

        await asyncio.sleep(0.06)
        connection.absent.add(SONG_QUEUE)  # deleted meanwhile
        assert await bind.missing(connection, "lyric.completed") is None  # type: ignore[arg-type]
        assert len(connection.bound) == first  # the publish does not wait for the look again
        await asyncio.sleep(0.01)  # the look again runs beside it, finds the queue gone
        assert await bind.missing(connection, "lyric.completed") == SONG_QUEUE  # type: ignore[arg-type]

        connection.absent.clear()  # declared again
        await asyncio.sleep(0.06)
        assert await bind.missing(connection, "lyric.completed") is None  # type: ignore[arg-type]
        assert connection.bound.count(SONG_QUEUE) == 2

    asyncio.run(run())
