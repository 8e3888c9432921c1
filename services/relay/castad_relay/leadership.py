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

The relays share the outboxes out (`Spread`): each keeps a row in every source database's
`outbox_relay`, written every third of `lease_s` and ending like a lease, and, counting the live
ones, aims at its fair share, ceil(outboxes / live relays). A relay leading fewer takes a free
lease at once; one leading its share leaves a free lease to the others for `GRACE_S` first (a
lone relay's share is every outbox, so it still takes them all); one leading more than its share
for a whole `lease_s` hands one lease back, one per `lease_s`: it stops acting on it first (as a
lost lease, `held()` is false from then on), marks what was confirmed, then ends it, so another
relay takes it at its next look. A dead relay's row was written before its last renewal, so it
ends before its lease does: the others count it out by the time they see its leases free, and
take them within `lease_s` and a look, as before.

Unlike a session's advisory lock, the lease does not depend on a connection staying open: it
survives a failover to a standby (the rows are replicated with everything else), runs through a
connection pooler, and is visible to an operator (`SELECT * FROM outbox_leader`, `outbox_relay`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from typing import Any

import psycopg
from castad_runtime import clock as clock_

from castad_relay import statements

log = logging.getLogger(__name__)
LOOK_S = 1.0  # how often a relay that does not lead looks whether the lease ran out
GRACE_S = 3 * LOOK_S  # how long a relay that leads its share leaves a free lease to one that leads fewer


class LostLeadership(Exception):
    """This relay no longer holds the lease of a database's outbox."""


class HandedBack(LostLeadership):
    """This relay gave the lease up for another relay to lead: it led more than its share."""


def fair_share(outboxes: int, relays: int) -> int:
    """How many outboxes each of `relays` live relays aims to lead: ceil(outboxes / relays)."""
    return math.ceil(outboxes / max(relays, 1))


class Spread:
    """How many outboxes one relay process leads, against its fair share among the live relays.

    Shared by the leases of one process, one per source database; each tells it, at each look, how
    many relays its database counts live."""

    def __init__(self, outboxes: int, lease_s: float, clock: clock_.Clock = clock_.now) -> None:
        self.outboxes = outboxes
        self.settle_s = lease_s  # how long a relay leads more than its share before it hands one lease back
        self.clock = clock
        self.leases: list[Lease] = []
        self._over_since: float | None = None  # since when it leads more than its share, by its own clock

    def leading(self) -> int:
        """How many outboxes this relay leads now."""
        return sum(lease.held() for lease in self.leases)

    def may_take(self, relays: int, free_for_s: float) -> bool:
        """Whether to take a lease free for `free_for_s` seconds: at once below the share, else after GRACE_S."""
        return self.leading() < fair_share(self.outboxes, relays) or free_for_s >= GRACE_S

    def hand_back(self, relays: int) -> bool:
        """Whether the caller's lease is to be handed back, this relay leading more than its share.

        Only once it led more for a whole `settle_s` (and handed none back meanwhile). One caller is told so; the
        next only `settle_s` later."""
        now = self.clock()
        if self.leading() <= fair_share(self.outboxes, relays):
            self._over_since = None
            return False
        if self._over_since is None:
            self._over_since = now
        if now - self._over_since < self.settle_s:
            return False
        self._over_since = now  # one lease at a time: the next is handed back only after another settle_s
        return True


class Lease:
    """This relay's lease of one database's outbox."""

    def __init__(
        self, holder: str, lease_s: float, clock: clock_.Clock = clock_.now, spread: Spread | None = None
    ) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self.holder = holder
        self.lease_s = lease_s
        self.clock = clock
        self.spread = spread or Spread(1, lease_s, clock)
        self.spread.leases.append(self)
        self.term: int | None = None  # the term this relay leads or last led under (None: it gave the lease up)
        self.relays = 1  # the live relays its database counted at the last look, this one included
        self.handing_back = False  # gave up acting on the lease, to end it for another relay
        self._valid_until = 0.0
        self._written_at: float | None = None  # when this relay last wrote its row among the live ones

    @staticmethod
    def holder_name(worker: str) -> str:
        """A holder name no other relay process has, even one with the same host name and pid."""
        return f"{worker}/{uuid.uuid4().hex[:8]}"

    def held(self) -> bool:
        """Whether this relay may act as the leader now."""
        return self.term is not None and self.clock() < self._valid_until

    def check(self) -> None:
        """Raise LostLeadership unless `held()` (HandedBack if this relay gave it up for another one)."""
        if self.handing_back:
            shared = f"{self.spread.outboxes} outboxes, {self.relays} relays"
            raise HandedBack(f"lease of term {self.term} handed back ({shared})")
        if not self.held():
            raise LostLeadership(f"lease of term {self.term} not held")

    async def take(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Take the lease if it ran out, or renew it if this relay holds it under its term; whether it holds it.

        Bounded by what is left of the lease: a renewal that comes back later than that is not counted."""
        sent_at = self.clock()
        remaining = self._valid_until - sent_at if self.held() else self.lease_s
        async with asyncio.timeout(max(remaining, 0.001)):
            await self._write_live(conn, sent_at)
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

    async def _write_live(self, conn: psycopg.AsyncConnection[Any], sent_at: float) -> None:
        """Keep this relay's row among the live ones.

        Written with each renewal (before it, so that the row ends no later than the lease), and every third
        of `lease_s` while it looks."""
        if self.held() or self._written_at is None or sent_at - self._written_at >= self.lease_s / 3:
            await conn.execute(statements.HEARTBEAT, {"holder": self.holder, "lease_s": self.lease_s})
            self._written_at = sent_at

    async def _may_take(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether the lease is this relay's, or free and its to take by the spread, by a read.

        A standby's look each second locks nothing and writes only its row among the live ones, every third
        of `lease_s` (TAKE_LEASE would write each time, and on a primary with a synchronous standby, wait for it).
        """
        cursor = await conn.execute(statements.LOOK, {"holder": self.holder})
        row = await cursor.fetchone()
        assert row is not None  # one row, even without a lease row
        holder, term, expired, free_for_s, others = row
        self.relays = others + 1
        if holder is None:
            return self.spread.may_take(self.relays, math.inf)
        if holder == self.holder and term == self.term:
            return True
        return bool(expired) and self.spread.may_take(self.relays, free_for_s)

    async def wait_until_taken(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Look every LOOK_S until this relay holds the lease."""
        while not await self.take(conn):
            await asyncio.sleep(LOOK_S)

    async def keep(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Renew the lease every third of `lease_s` while it is held; return once it is lost or to be handed back.

        Handed back (`handing_back`): this relay acts on it no more, and its holder is to end it. A renewal
        that fails on the way (an outage, a timeout) is tried again each LOOK_S while the lease lasts; the
        lease is lost when it ran out, or when another relay took it."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            while True:
                try:
                    if not await self.take(conn):
                        return
                    if self.spread.hand_back(self.relays):
                        self.handing_back, self._valid_until = True, 0.0
                        return
                    break
                except (psycopg.Error, OSError, TimeoutError) as error:
                    if not self.held():
                        log.warning("could not renew the lease of term %s in time (%s)", self.term, error)
                        return
                    await asyncio.sleep(min(LOOK_S, self.lease_s / 3))

    async def release(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Give the lease up at once, so that another relay takes over without waiting.

        A stopping relay does, and one handing the lease back."""
        self._valid_until = 0.0
        self.handing_back = False
        term, self.term = self.term, None  # not to be taken back as its own: it waits its turn as any other relay
        if term is not None:
            await conn.execute(statements.RELEASE_LEASE, {"holder": self.holder, "term": term})

    async def leave(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Take this relay's row out of the live ones (a stopping relay), so that the others count it out at once."""
        await conn.execute(statements.LEAVE, {"holder": self.holder})
        self._written_at = None
