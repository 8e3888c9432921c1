"""Which relay publishes a database's outbox: a lease row with a term, renewed by its holder.

Each source database has one row, `outbox_leader`: who holds the lease, until when by the
database's clock, and its term, which grows by one whenever another relay takes it. A relay
takes the lease once it expired (or holds it still under its own term) and renews it every
third of `lease_s`; the others look every `LOOK_S` and take over once it ran out. A leader
that freezes (a paused machine, a long stop), dies or is cut off from the database stops
renewing, so another relay leads within `lease_s` and a look.

The holder is fenced by its own clock (castad_runtime.clock, which counts a suspended machine's
sleep): it acts only while `held()`, that is until `lease_s` after it sent the renewal that last
succeeded. The database set the lease's end no earlier
than that statement's start, so no other relay can have taken over while `held()` is true.
A leader that wakes after losing the lease therefore publishes nothing more; the rows it had
taken are published by the new leader, in order, and whatever it had confirmed but not
marked is only sent twice, which inboxes drop.

Unlike a session's advisory lock, the lease does not depend on a connection staying open: it
survives a failover to a standby (the row is replicated with everything else), runs through a
connection pooler, and is visible to an operator (`SELECT * FROM outbox_leader`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import psycopg
from castad_runtime import clock as clock_

from castad_relay import statements

log = logging.getLogger(__name__)
LOOK_S = 1.0  # how often a relay that does not lead looks whether the lease ran out


class LostLeadership(Exception):
    """This relay no longer holds the lease of a database's outbox."""


class Lease:
    """This relay's lease of one database's outbox."""

    def __init__(self, holder: str, lease_s: float, clock: clock_.Clock = clock_.now) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self.holder = holder
        self.lease_s = lease_s
        self.clock = clock
        self.term: int | None = None  # the term this relay leads or last led under
        self._valid_until = 0.0

    @staticmethod
    def holder_name(worker: str) -> str:
        """A holder name no other relay process has, even one with the same host name and pid."""
        return f"{worker}/{uuid.uuid4().hex[:8]}"

    def held(self) -> bool:
        """Whether this relay may act as the leader now."""
        return self.term is not None and self.clock() < self._valid_until

    def check(self) -> None:
        """Raise LostLeadership unless `held()`."""
        if not self.held():
            raise LostLeadership(f"lease of term {self.term} not held")

    async def take(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Take the lease if it ran out, or renew it if this relay holds it under its term; whether it holds it.

        Bounded by what is left of the lease: a renewal that comes back later than that is not counted."""
        sent_at = self.clock()
        remaining = self._valid_until - sent_at if self.held() else self.lease_s
        async with asyncio.timeout(max(remaining, 0.001)):
            if not await self._may_take(conn):
                self._valid_until = 0.0
                return False
            cursor = await conn.execute(
                statements.TAKE_LEASE, {"holder": self.holder, "term": self.term or 0, "lease_s": self.lease_s}
            )
            row = await cursor.fetchone()
        if row is None:
            self._valid_until = 0.0
            return False
        if row[0] != self.term:
            log.info("took the lease of term %d", row[0])
        self.term, self._valid_until = row[0], sent_at + self.lease_s
        return True

    async def _may_take(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether the lease is free or this relay's, by a read.

        A standby's look each second locks and writes nothing (TAKE_LEASE would, and on a primary with a
        synchronous standby, wait for it).
        """
        cursor = await conn.execute(statements.LEASE)
        row = await cursor.fetchone()
        if row is None:
            return True
        holder, term, expired = row
        return bool(expired) or (holder == self.holder and term == self.term)

    async def wait_until_taken(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Look every LOOK_S until this relay holds the lease."""
        while not await self.take(conn):
            await asyncio.sleep(LOOK_S)

    async def keep(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Renew the lease every third of `lease_s` while it is held; return once it is lost.

        A renewal that fails on the way (an outage, a timeout) is tried again each LOOK_S while the lease
        lasts; the lease is lost when it ran out, or when another relay took it."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            while True:
                try:
                    if not await self.take(conn):
                        return
                    break
                except (psycopg.Error, OSError, TimeoutError) as error:
                    if not self.held():
                        log.warning("could not renew the lease of term %s in time (%s)", self.term, error)
                        return
                    await asyncio.sleep(min(LOOK_S, self.lease_s / 3))

    async def release(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Give the lease up at once (a stopping relay), so that another one takes over without waiting."""
        if self.term is not None:
            await conn.execute(statements.RELEASE_LEASE, {"holder": self.holder, "term": self.term})
        self._valid_until = 0.0
