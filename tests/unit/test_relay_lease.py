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
    """Answers the relay's statements as outbox_leader and outbox_relay would: the lease held by `holder` under
    `term` until it ran out, and the live relays' rows."""

    def __init__(self, clock: Clock, holder: str | None = None, term: int = 0, expires: float = 0.0) -> None:
        self.clock = clock
        self.holder, self.term, self.expires = holder, term, expires
        self.relays: dict[str, float] = {}  # holder: until when its row says it is live
        self.statements: list[str] = []

    async def execute(self, statement: str, params: dict[str, Any] | None = None) -> Any:
        self.statements.append(statement)
        now = self.clock()
        expired = now >= self.expires
        assert params is not None
        if statement == statements.HEARTBEAT:
            self.relays[params["holder"]] = now + params["lease_s"]
            return Rows([])
        if statement == statements.LOOK:
            others = sum(until >= now for holder, until in self.relays.items() if holder != params["holder"])
            if self.holder is None:
                return Rows([(None, None, None, None, others)])
            return Rows([(self.holder, self.term, expired, now - self.expires, others)])
        if statement == statements.RELEASE_LEASE:
            if (self.holder, self.term) == (params["holder"], params["term"]):
                self.expires = now
            return Rows([])
        if statement == statements.LEAVE:
            self.relays.pop(params["holder"], None)
            return Rows([])
        assert statement == statements.TAKE_LEASE
        mine = self.holder == params["holder"] and self.term == params["term"]
        if not (mine or expired or self.holder is None):
            return Rows([])
        self.term = self.term if mine else self.term + 1
        self.holder, self.expires = params["holder"], now + params["lease_s"]
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
    assert database.statements == [statements.HEARTBEAT, statements.LOOK]  # only its row among the live ones
    clock.now += 1
    assert not take(standby, database)
    assert database.statements[2:] == [statements.LOOK]  # a look locks and writes nothing
    clock.now += 5
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


def test_a_fair_share_is_the_outboxes_over_the_live_relays_rounded_up():
    assert [leadership.fair_share(4, relays) for relays in (0, 1, 2, 3, 4, 5)] == [4, 4, 2, 2, 1, 1]
    assert leadership.fair_share(1, 2) == 1  # a single outbox: one leader, the others stand by


def relay_process(name: str, clock: Clock, databases: list[Database], lease_s: float = 6) -> list[leadership.Lease]:
    """One relay process's leases, one per database, sharing its spread."""
    spread = leadership.Spread(len(databases), lease_s, clock)
    return [leadership.Lease(name, lease_s, clock, spread) for _ in databases]


def test_a_lone_relay_takes_every_free_lease_at_once():
    clock = Clock()
    databases = [Database(clock) for _ in range(4)]
    leases = relay_process("relay-a", clock, databases)

    assert all(take(lease, database) for lease, database in zip(leases, databases, strict=True))
    assert leases[0].spread.leading() == 4


def test_a_relay_at_its_share_leaves_a_free_lease_to_the_others_for_a_grace():
    clock = Clock()
    databases = [Database(clock) for _ in range(4)]
    leases = relay_process("relay-a", clock, databases)
    for database in databases:
        database.relays["relay-b"] = clock.now + 6  # a second relay is live
    assert take(leases[0], databases[0]) and take(leases[1], databases[1])  # below its share of 2: at once

    databases[2].holder, databases[2].term, databases[2].expires = "relay-b", 1, clock.now  # free just now
    assert not take(leases[2], databases[2])
    clock.now += leadership.GRACE_S - 0.1
    assert not take(leases[2], databases[2])
    clock.now += 0.1  # nobody took it: relay-a does, though over its share
    assert take(leases[2], databases[2]) and leases[0].spread.leading() == 3


def test_a_relay_over_its_share_hands_one_lease_back_per_lease_s_down_to_its_share_and_no_further():
    clock = Clock()
    databases = [Database(clock) for _ in range(4)]
    leases = relay_process("relay-a", clock, databases, lease_s=6)
    for lease, database in zip(leases, databases, strict=True):
        take(lease, database)
    spread = leases[0].spread
    for database in databases:
        database.relays["relay-b"] = clock.now + 1000  # a second relay joins: relay-a's share is 2

    handed_back_at = []
    for _ in range(60):  # 2 minutes of renewals, each lease every lease_s/3
        clock.now += 2
        for lease, database in zip(leases, databases, strict=True):
            if lease.held() and take(lease, database) and spread.hand_back(lease.relays):
                asyncio.run(lease.release(database))  # type: ignore[arg-type]
                handed_back_at.append(clock.now)

    assert spread.leading() == 2
    assert len(handed_back_at) == 2  # never below the share: no flapping
    assert handed_back_at[0] - 100 >= 6 and handed_back_at[1] - handed_back_at[0] >= 6


def run_relays(
    clock: Clock, databases: list[Database], relays: dict[str, list[leadership.Lease]], seconds: int
) -> None:
    """Each live relay of `relays` a second at a time, as `Lease.keep` and `wait_until_taken` run them: a look
    each LOOK_S while it does not lead; a renewal every third of lease_s while it does, handing back as told."""
    for tick in range(seconds):
        clock.now += leadership.LOOK_S
        for leases in relays.values():
            for lease, database in zip(leases, databases, strict=True):
                if not lease.held():
                    take(lease, database)
                elif tick % 2 == 0 and take(lease, database) and lease.spread.hand_back(lease.relays):
                    asyncio.run(lease.release(database))  # type: ignore[arg-type]


def test_two_relays_spread_four_outboxes_and_keep_them_spread():
    clock = Clock()
    databases = [Database(clock) for _ in range(4)]
    relays = {"relay-a": relay_process("relay-a", clock, databases)}
    run_relays(clock, databases, relays, 5)
    assert relays["relay-a"][0].spread.leading() == 4

    relays["relay-b"] = relay_process("relay-b", clock, databases)
    run_relays(clock, databases, relays, 20)
    assert [leases[0].spread.leading() for leases in relays.values()] == [2, 2]
    terms = [database.term for database in databases]
    run_relays(clock, databases, relays, 120)
    assert [database.term for database in databases] == terms  # no lease changed hands since: no flapping

    del relays["relay-b"]  # it dies: its leases and its rows run out
    run_relays(clock, databases, relays, 8)  # lease_s and a look, and a second for the one-second ticks
    assert relays["relay-a"][0].spread.leading() == 4
