"""The API keys that hold event streams open on this gateway process.

At most so many streams each, and each key looked at again while it holds one, so that a revoked key's streams end
within seconds.

A stream is authenticated once, when it opens, and may stay open an hour (the stream of every pipeline)
or as long as its pipeline runs. So one task of the process (`watching`) looks at every key that holds a
stream every CASTAD_API_SSE_KEY_CHECK_S, one indexed look-up per key however many streams it holds, and
wakes the streams of a key found revoked; an idle stream need not wake to look. A stream also asks `valid`
each time it wakes, answered from the last look-up. While the database is out, a key keeps its streams
(they wait for the database as they read it).

In process, as auth.py: across N replicas a key may hold N times its cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator

import sqlalchemy as sa
from castad_runtime import outages
from fastapi.concurrency import run_in_threadpool

from castad_api import keys

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5  # what a key over its cap is told to wait: streams end at least that often (a client leaves)


class TooMany(Exception):
    """The key holds as many event streams as it may."""


@dataclasses.dataclass
class _Held:
    streams: int = 0
    valid: bool = True
    checked_at: float = 0.0
    wakers: set[asyncio.Event] = dataclasses.field(default_factory=set)  # set when the key is found revoked


class Lease:
    """A key's place among its open streams, given back once (when its stream ends, or is never read)."""

    def __init__(self, key_id: uuid.UUID, give_back: Callable[[uuid.UUID], None]) -> None:
        self.key_id = key_id
        self._give_back = give_back
        self._held = True
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._give_back(self.key_id)

    def bind(self, stream: object) -> None:
        """Give the place back when `stream` (a generator never started, whose `finally` never runs) is freed."""
        weakref.finalize(stream, self.release)


class StreamKeys:
    def __init__(
        self, engine: sa.Engine, per_key: int, check_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.engine = engine
        self.per_key = per_key
        self.check_s = check_s
        self.clock = clock
        self._held: dict[uuid.UUID, _Held] = {}
        self._lock = threading.Lock()
        self._watcher: asyncio.Task[None] | None = None

    def admit(self, key_id: uuid.UUID) -> Lease:
        """A place for one more stream of the key (just authenticated); TooMany beyond its cap."""
        with self._lock:
            held = self._held.setdefault(key_id, _Held(checked_at=self.clock()))
            if held.streams >= self.per_key:
                raise TooMany(f"this key holds {self.per_key} event streams open already")
            held.streams += 1
        return Lease(key_id, self._give_back)

    def _give_back(self, key_id: uuid.UUID) -> None:
        with self._lock:
            held = self._held.get(key_id)
            if held is not None:
                held.streams -= 1
                if held.streams <= 0:
                    del self._held[key_id]

    def open_streams(self, key_id: uuid.UUID) -> int:
        with self._lock:
            held = self._held.get(key_id)
            return held.streams if held is not None else 0

    async def valid(self, key_id: uuid.UUID) -> bool:
        """Whether the key may keep its streams: the database's answer, at most `check_s` old."""
        with self._lock:
            held = self._held.get(key_id)
            if held is None:
                return False
            if not held.valid or self.clock() - held.checked_at < self.check_s:
                return held.valid
            held.checked_at = self.clock()  # one look-up at a time per key: the others keep the last answer
        try:
            answer = await run_in_threadpool(self._look_up, key_id)
        except Exception as error:
            if not outages.is_outage(error):
                raise
            return True  # the database is out: the stream waits for it, as its reads do
        with self._lock:
            held = self._held.get(key_id)
            if held is not None:
                held.valid = answer
            wakers = list(held.wakers) if held is not None and not answer else []
        for event in wakers:
            event.set()
        return answer

    @contextlib.contextmanager
    def watching(self, key_id: uuid.UUID, wake: asyncio.Event) -> Iterator[None]:
        """Set `wake` once the key (holding a stream) is found revoked, meanwhile; in the event loop."""
        with self._lock:
            held = self._held.get(key_id)
            if held is not None:
                held.wakers.add(wake)
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="stream-keys")
        try:
            yield
        finally:
            with self._lock:
                held = self._held.get(key_id)
                if held is not None:
                    held.wakers.discard(wake)

    async def _watch(self) -> None:
        """Look at every key holding a stream every `check_s`, until none holds one."""
        while True:
            await asyncio.sleep(self.check_s)
            with self._lock:
                held = list(self._held)
            if not held:
                return  # started again by the next stream (no await between this look and the end)
            for key_id in held:
                try:
                    await self.valid(key_id)
                except Exception:
                    log.exception("looking at an API key that holds event streams failed; looking again later")

    def _look_up(self, key_id: uuid.UUID) -> bool:
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return keys.valid(conn, key_id)
