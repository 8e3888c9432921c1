"""The relay's lease as its holder knows it.

By its own clock, from the moment it sent the renewal that last succeeded (the database set the lease's end no
earlier than that statement's start).
"""

from __future__ import annotations

import asyncio
from typing import Any

from castad_relay import leadership, statements


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Database:
    """Answers the lease statements as the outbox_leader row would: held by `holder` under `term` until it ran out."""

    def __init__(self, clock: Clock, holder: str | None = None, term: int = 0, expires: float = 0.0) -> None:
        self.clock = clock
        self.holder, self.term, self.expires = holder, term, expires
        self.statements: list[str] = []

    async def execute(self, statement: str, params: dict[str, Any] | None = None) -> Any:
        self.statements.append(statement)
        expired = self.clock() >= self.expires
        if statement == statements.LEASE:
            return Rows([(self.holder, self.term, expired)] if self.holder else [])
        assert statement == statements.TAKE_LEASE and params is not None
        mine = self.holder == params["holder"] and self.term == params["term"]
        if not (mine or expired or self.holder is None):
            return Rows([])
        self.term = self.term if mine else self.term + 1
        self.holder, self.expires = params["holder"], self.clock() + params["lease_s"]
        return Rows([(self.term,)])


class Rows:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    async def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None


def take(lease: leadership.Lease, database: Database) -> bool:
    return asyncio.run(lease.take(database))  # type: ignore[arg-type]


def test_a_lease_is_held_until_lease_s_after_the_renewal_that_last_succeeded_was_sent():
    clock = Clock()
    lease = leadership.Lease("relay-a", lease_s=6, clock=clock)
    database = Database(clock)

    assert take(lease, database) and lease.term == 1
    clock.now += 5.9
    assert lease.held()
    clock.now += 0.1
    assert not lease.held()  # frozen past it: whatever it was about to publish must not go


def test_a_renewal_keeps_the_term_and_moves_the_end_from_its_own_start():
    clock = Clock()
    lease = leadership.Lease("relay-a", lease_s=6, clock=clock)
    database = Database(clock)
    take(lease, database)

    clock.now += 4
    assert take(lease, database) and lease.term == 1
    clock.now += 5.9
    assert lease.held()


def test_a_standby_only_reads_while_the_lease_is_anothers_and_takes_it_with_a_new_term_once_it_ran_out():
    clock = Clock()
    database = Database(clock, holder="relay-a", term=3, expires=clock.now + 6)
    standby = leadership.Lease("relay-b", lease_s=6, clock=clock)

    assert not take(standby, database) and not standby.held()
    assert database.statements == [statements.LEASE]  # a look locks and writes nothing
    clock.now += 6
    assert take(standby, database) and (standby.term, database.holder) == (4, "relay-b")


def test_a_leader_that_wakes_after_another_took_over_neither_holds_nor_renews():
    clock = Clock()
    database = Database(clock)
    frozen = leadership.Lease("relay-a", lease_s=6, clock=clock)
    take(frozen, database)
    clock.now += 7
    take(leadership.Lease("relay-b", lease_s=6, clock=clock), database)

    assert not frozen.held()
    assert not take(frozen, database) and database.holder == "relay-b" and database.term == 2
