"""Wakes event streams when the projection commits: one LISTEN connection per process."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterator

import psycopg
from castad_runtime import db

from castad_api import repository

log = logging.getLogger(__name__)
EVERY_PIPELINE = "*"  # subscribe to this to hear of every pipeline (no pipeline id looks like it)


class PipelineNotifications:
    def __init__(self, database_url: str) -> None:
        self.url = database_url
        self._waiters: dict[str, set[asyncio.Event]] = collections.defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="pipeline-notifications")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

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

    async def _listen(self) -> None:
        while True:
            try:
                connecting = psycopg.AsyncConnection.connect(**db.connect_kwargs(self.url), autocommit=True)
                async with await connecting as conn:
                    await conn.execute(f"LISTEN {repository.PIPELINE_EVENTS_CHANNEL}")
                    while True:
                        for notice in await db.notifications(conn):
                            for key in (notice.payload, EVERY_PIPELINE):
                                for event in self._waiters.get(key, ()):
                                    event.set()
            except psycopg.Error as error:
                log.warning("notification listener lost its database (%s); streams fall back to polling", error)
                await asyncio.sleep(1.0)
