"""An event goes out only once a replica of each service that takes it reads its version.

Each consuming replica says in its service's database which version of each event type it reads
(castad_runtime.announcement). Before the relay publishes an event, it looks at the word of every service whose
queue takes the event's type (`topology.subscribers`): the replicas live now or, when none is, the one seen last
(a service that is down keeps its queue, and its next start is most likely that replica's release). If none of
them reads the event's type at its version, or one of them does not take its type at all (a type the service
newly takes, which a replica of the release before would dead-letter as one it has no handler for: it waits until
no such replica is live), the event waits in its outbox, uncharged, with the reason in its row, and the relay
looks again a while later: a producer upgraded before its consumers writes an event only the new
release reads (a brief with a new field), and it goes out once a replica of that release runs. Where the relay
cannot tell (no word at all: a release before these words, or a database it does not relay, not migrated or not
reachable), it publishes as before, and a consumer that cannot read an event holds it for a while.

What each database says is looked at once every `FRESH_S` at most (a database that could not be read, once every
`FAILED_RECHECK_S`: a look waits for it up to `LOOK_TIMEOUT_S`, on the way of every event it would take), and a
row held for a reader is looked at again `UNREAD_RECHECK_S` later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

import psycopg
from castad_contracts import topology
from castad_runtime import announcement, db, redact

from castad_relay import connection

log = logging.getLogger(__name__)

FRESH_S = 5.0
FAILED_RECHECK_S = 60.0
LOOK_TIMEOUT_S = 5.0
UNREAD_RECHECK_S = 10.0

# What a service's replicas read, newest word first, and whether each replica is live.
LOOK = """
SELECT reads, seen_at >= now() - make_interval(secs => %(live_s)s) AS live
FROM public.replicas ORDER BY seen_at DESC
"""


@dataclasses.dataclass(frozen=True)
class Unread:
    """No replica of `service` reads this event's type at its version (yet)."""

    service: str
    event_type: str
    version: int
    newest: int  # the newest version of the type a replica of the service reads (0: none reads the type)
    untaken: bool = False  # a live replica does not take the type at all (it would dead-letter it)

    def reason(self) -> str:
        if self.untaken and self.newest >= self.version:
            return (
                f"waits until no replica of {self.service} that does not take {self.event_type} runs (it would"
                f" dead-letter it); it goes out once they are replaced"
            )
        reads = f"they read up to version {self.newest}" if self.newest else "they do not take it"
        return (
            f"waits for a replica of {self.service} that reads {self.event_type} version {self.version} ({reads});"
            f" it goes out once one runs"
        )


class Readers:
    def __init__(self, databases: Mapping[str, str], sessions: db.SessionLimits) -> None:
        self.databases = dict(databases)  # service -> the URL of its database, where its replicas say what they read
        self.sessions = sessions
        # service -> until when its word stands, and what it is (None: no word)
        self._looked: dict[str, tuple[float, list[dict[str, Any]] | None]] = {}
        self._subscribers: dict[str, tuple[str, ...]] = {}  # event type -> the services taking it
        self._said: dict[str, str] = {}  # service -> why its word could not be read, said once until it can
        self._waiting: set[tuple[str, str, int]] = set()  # (service, type, version) found unread, said once
        self._locks: dict[str, asyncio.Lock] = {}

    async def unread(self, event_type: str, version: int) -> Unread | None:
        """The first service taking `event_type` none of whose replicas reads `version`; None if each has one."""
        services = self._subscribers.get(event_type)
        if services is None:
            services = self._subscribers[event_type] = tuple(topology.subscribers(event_type))
        for service in services:
            word = await self._word(service)
            if not word:
                continue  # no word: published as before
            considered = [replica for replica in word if replica["live"]] or word[:1]
            reads = [_reads(replica, event_type) for replica in considered]
            newest, untaken = max(reads), min(reads) == 0
            waiting = (service, event_type, version)
            if newest < version or untaken:
                unread = Unread(service, event_type, version, newest, untaken)
                if waiting not in self._waiting:
                    self._waiting.add(waiting)
                    log.warning("events of type %s version %d: %s", event_type, version, unread.reason())
                return unread
            if waiting in self._waiting:
                self._waiting.discard(waiting)
                log.info("a replica of %s reads %s version %d: the events that waited for it go out", *waiting)
        return None

    async def _word(self, service: str) -> list[dict[str, Any]] | None:
        url = self.databases.get(service)
        if url is None:
            return None
        looked = self._looked.get(service)
        if looked is not None and time.monotonic() < looked[0]:
            return looked[1]
        async with self._locks.setdefault(service, asyncio.Lock()):  # the rows of many pipelines ask at once
            looked = self._looked.get(service)
            if looked is not None and time.monotonic() < looked[0]:
                return looked[1]
            word = await self._look(service, url)
            stands_s = FRESH_S if word is not None else FAILED_RECHECK_S
            self._looked[service] = (time.monotonic() + stands_s, word)
            return word

    async def _look(self, service: str, url: str) -> list[dict[str, Any]] | None:
        try:
            async with asyncio.timeout(LOOK_TIMEOUT_S):
                async with await connection.database(url, self.sessions) as conn:
                    cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
                    await cursor.execute(LOOK, {"live_s": announcement.LIVE_S})
                    word = await cursor.fetchall()
        except (psycopg.Error, OSError, TimeoutError) as error:
            why = redact.describe(error)
            if self._said.get(service) is None:
                log.warning(
                    "cannot read what the replicas of %s read (%s): its events go out unchecked until it can",
                    service,
                    why,
                )
            self._said[service] = why
            return None
        if self._said.pop(service, None) is not None:
            log.info("reads what the replicas of %s read again", service)
        return word


def _reads(replica: Mapping[str, Any], event_type: str) -> int:
    reads = replica["reads"]
    version = reads.get(event_type) if isinstance(reads, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) else 0
