"""An event stream reads the database when its pipeline is said to have changed, not on a clock.

While the gateway's listener listens, an idle stream does not read; it reads on its clock only while the listener
does not listen; a key's revocation and a missing entry still wake it in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import types
import uuid

import sqlalchemy as sa
from castad_api import notifications, stream_keys, streams

NOWHERE = "postgresql+psycopg://nobody@127.0.0.1:1/none"


def gateway(poll_s: float, check_s: float = 60.0) -> types.SimpleNamespace:
    """What a stream uses of the gateway: its settings, its listener (not started) and its keys' places."""
    return types.SimpleNamespace(
        config=types.SimpleNamespace(sse_poll_s=poll_s),
        notifications=notifications.PipelineNotifications(NOWHERE),
        stream_keys=stream_keys.StreamKeys(sa.create_engine(NOWHERE), 10, check_s),
        metrics=types.SimpleNamespace(streams=types.SimpleNamespace(track_inprogress=contextlib.nullcontext)),
    )


class Reads:
    """A stream's reads: each finds one message and moves the cursor on."""

    def __init__(self, again_s: float | None = None) -> None:
        self.cursors: list[int] = []
        self.again_s = again_s

    def __call__(self, cursor: int) -> streams.Batch[int]:
        self.cursors.append(cursor)
        return streams.Batch([{"data": str(cursor)}], cursor + 1, again_s=self.again_s)


def opened(gw: types.SimpleNamespace, read: Reads, pipeline: str = "p1"):
    return streams.follow(gw, gw.stream_keys.admit(uuid.uuid4()), pipeline, read, 0)  # type: ignore[arg-type]


def test_an_idle_stream_reads_only_when_its_pipeline_is_notified_while_the_listener_listens():
    async def scenario() -> None:
        gw, read = gateway(poll_s=0.02), Reads()
        gw.notifications.listening = True
        stream = opened(gw, read)
        assert await anext(stream) == {"data": "0"}
        waiting = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.3)  # fifteen turns of the clock it would poll on
        gw.notifications.notify("p2")  # another pipeline's change
        await asyncio.sleep(0.05)
        assert read.cursors == [0] and not waiting.done()

        gw.notifications.notify("p1")
        assert await asyncio.wait_for(waiting, 2) == {"data": "1"}
        assert read.cursors == [0, 1]
        await stream.aclose()

    asyncio.run(scenario())


def test_a_stream_reads_on_its_clock_while_the_listener_does_not_listen():
    async def scenario() -> None:
        gw, read = gateway(poll_s=0.02), Reads()
        stream = opened(gw, read)
        received = [await asyncio.wait_for(anext(stream), 2) for _ in range(4)]
        assert [message["data"] for message in received] == ["0", "1", "2", "3"]
        await stream.aclose()

    asyncio.run(scenario())


def test_a_stream_stopped_at_a_missing_entry_reads_again_without_being_notified():
    async def scenario() -> None:
        gw, read = gateway(poll_s=60), Reads(again_s=0.05)
        gw.notifications.listening = True
        stream = opened(gw, read)
        await anext(stream)
        assert await asyncio.wait_for(anext(stream), 2) == {"data": "1"}
        await stream.aclose()

    asyncio.run(scenario())


def test_a_revoked_keys_idle_stream_is_woken_and_ends_within_the_key_check():
    async def scenario() -> None:
        gw, read = gateway(poll_s=60, check_s=0.05), Reads()
        gw.stream_keys._look_up = lambda key_id: False  # the key was revoked in the database
        gw.notifications.listening = True
        stream = opened(gw, read)
        await anext(stream)
        with contextlib.suppress(StopAsyncIteration):
            await asyncio.wait_for(anext(stream), 2)
            raise AssertionError("the stream of a revoked key went on")
        assert read.cursors == [0]

    asyncio.run(scenario())
