"""Wakes event streams when the projection commits.

One LISTEN connection per process, whose notifications go to the open streams of the pipelines they name (and to
the streams of every pipeline).

While it listens, a stream reads the database only when woken. Whatever was committed while it did not
listen was never heard: when it (re)connects, and when it loses its connection, it wakes every stream,
which reads again and, until it listens again, reads on a clock (CASTAD_API_SSE_POLL_S).

A notification can also be lost without the listener noticing: a connection cut without a word looks
alive until TCP gives up on it, and a fail-over to a standby carries no notifications. So every
CASTAD_API_SSE_SWEEP_S the process sweeps once, whatever the number of its streams: it asks which of
the pipelines with open streams have timeline entries after the newest seq of two sweeps ago (entries
commit out of seq order, never by that much), and wakes their streams (and those of every pipeline, if
anything was written). Nothing is read for a pipeline that did not change."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from collections.abc import Iterator

import psycopg
from castad_runtime import db

from castad_api import timeline_rows

log = logging.getLogger(__name__)
EVERY_PIPELINE = "*"  # subscribe to this to hear of every pipeline (no pipeline id looks like it)


class PipelineNotifications:
    def __init__(self, database_url: str, sweep_s: float = 45.0) -> None:
        self.url = database_url
        self.sweep_s = sweep_s
        self._waiters: dict[str, set[asyncio.Event]] = collections.defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.listening = False  # its LISTEN is on: a stream may wait for a notification rather than on a clock

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="pipeline-notifications")
        self._sweeper = asyncio.create_task(self._sweep(), name="pipeline-notifications-sweep")

    async def stop(self) -> None:
        for task in (self._task, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @contextlib.contextmanager
    def subscribe(self, pipeline_id: str) -> Iterator[asyncio.Event]:
        """An event set when this pipeline's timeline grows (EVERY_PIPELINE: any pipeline's), from now on.

        Subscribe before reading the timeline: a notification that comes between the
        read and the wait would otherwise be missed until the next poll.
        """
        event = asyncio.Event()
        self._waiters[pipeline_id].add(event)
        try:
            yield event
        finally:
            self._waiters[pipeline_id].discard(event)
            if not self._waiters[pipeline_id]:
                del self._waiters[pipeline_id]

    def notify(self, pipeline_id: str) -> None:
        """Wake the streams of `pipeline_id`, and those of every pipeline."""
        for key in (pipeline_id, EVERY_PIPELINE):
            for event in self._waiters.get(key, ()):
                event.set()

    def _wake_all(self) -> None:
        for waiting in self._waiters.values():
            for event in waiting:
                event.set()

    async def _sweep(self) -> None:
        marks: collections.deque[int] = collections.deque(maxlen=2)  # the newest seq at the last two sweeps
        while True:
            await asyncio.sleep(self.sweep_s)
            if not self.listening:
                marks.clear()  # the streams read on their clock meanwhile, and all are woken when it listens
                continue
            pipelines = [key for key in self._waiters if _is_pipeline(key)]
            after = marks[0] if marks else None
            try:
                newest, changed = await asyncio.to_thread(self._changed, pipelines, after)
            except psycopg.Error as error:
                log.warning("the sweep of the event streams could not read the database (%s)", error)
                continue
            marks.append(newest)
            if after is None:
                continue
            for pipeline_id in changed:
                for event in self._waiters.get(pipeline_id, ()):
                    event.set()
            if newest > after:
                for event in self._waiters.get(EVERY_PIPELINE, ()):
                    event.set()

    def _changed(self, pipelines: list[str], after: int | None) -> tuple[int, list[str]]:
        """The newest seq, and which of `pipelines` have entries after seq `after` (None: none asked)."""
        with psycopg.connect(**db.connect_kwargs(self.url), autocommit=True) as conn:
            row = conn.execute(timeline_rows.NEWEST_ENTRY).fetchone()
            newest = int(row[0]) if row else 0
            if after is None or not pipelines:
                return newest, []
            found = conn.execute(timeline_rows.PIPELINES_WITH_ENTRIES_AFTER, (pipelines, after)).fetchall()
        return newest, [pipeline_id for (pipeline_id,) in found]

    async def _listen(self) -> None:
        while True:
            try:
                connecting = psycopg.AsyncConnection.connect(**db.connect_kwargs(self.url), autocommit=True)
                async with await connecting as conn:
                    await conn.execute(f"LISTEN {timeline_rows.PIPELINE_EVENTS_CHANNEL}")
                    self.listening = True
                    self._wake_all()  # what committed before it listened was not heard: every stream reads again
                    while True:
                        for notice in await db.notifications(conn):
                            self.notify(notice.payload)
            except psycopg.Error as error:
                log.warning("notification listener lost its database (%s); streams fall back to polling", error)
            self.listening = False
            self._wake_all()  # each stream goes over to its clock until the listener is back
            await asyncio.sleep(1.0)


def _is_pipeline(key: str) -> bool:
    try:
        uuid.UUID(key)
    except ValueError:
        return False
    return True
