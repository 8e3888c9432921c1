"""A provider's limits, kept in the service's own database so that every worker shares them.

- Rate: a token bucket (`burst` tokens, refilled at `rate_per_s`); every claim that calls the
  provider (a submit or a poll) takes a token. When the provider says "too many" (429, or its
  own way of saying it) the rate halves, down to `min_rate_per_s`, and nothing is claimed before
  its Retry-After; every call that goes through raises the rate again by a twentieth of the
  range, up to `max_rate_per_s` (additive increase, multiplicative decrease).
- Concurrency: at most `max_in_flight` jobs at the provider at once (RUNNING or AWAITING); past
  it, only polls of work already there are claimed.

Waiting for quota is not an attempt: a job that finds no token simply stays due, unclaimed.
The clock is the database's, so workers on different machines agree.

No claim locks or writes a row every other claim needs (issue 37: one locked row per provider
capped every replica's claims together at what one row lock a commit allows):

- The bucket is split into `shards` rows (`quota_shards`), each with `burst / shards` tokens
  refilled at `rate_per_s / shards`: a claim takes a token from any shard that has one and that
  no other claim holds (`FOR UPDATE SKIP LOCKED`), so concurrent claims take different rows; it
  waits for a held shard only when no free one has a token. A shard refills more slowly than the
  bucket, and a token left in one shard is not seen by a claim that found another: so there are
  at most `MAX_SHARDS`, at most `floor(burst)` (each holds a whole token), and at most one for each
  `SHARD_RATE_PER_S` of the highest rate (each refills a token within a tenth of a second then). A
  provider with a rate of a few calls a second keeps one shard: its claims are too few to contend. The
  AIMD state (the rate, the Retry-After block) stays in the provider's `quotas` row, which a claim
  only reads: only a call's outcome writes it (`throttled`, and `relieved` while the rate is
  below its highest), and the shards refill lazily at whatever rate that row holds.
- Jobs in flight are counted by the database itself: triggers on `jobs` add one to a row of
  `in_flight_counts` when a job becomes RUNNING or AWAITING, and take one away when it stops being
  either, in the transaction that changed its status, whatever changed it (a claim, an outcome, a
  cancel, a lease's recovery, an operator's retry, a service of an older version during an
  upgrade). The rows' sum is the count, exactly. Each row has a share of `max_in_flight` as its
  `cap` (given by `configure`, which moves the jobs counted so far to rows below their shares, any
  beyond the cap to a row that the triggers take jobs away from first); a claim that may start new
  work holds a row below its cap (SKIP LOCKED again), and the trigger adds its job to a row below
  its cap, which that held row guarantees there is. No row
  ever goes above its cap by a claim, so the sum never goes above `max_in_flight`; and while the
  sum is below it some row is below its own cap, so no claim is refused while there is room
  (unless every such row is held by another claim at that instant: that claim polls instead, and
  the job is claimed by the next one). A trigger waits for a row another transaction holds only
  when every one of the `IN_FLIGHT_SHARDS` rows is held: rare while a service's connections are
  fewer, and a deadlock it then meets is PostgreSQL's to break, the transaction it ends retried as
  an outage (castad_runtime.outages), with nothing lost or counted twice.

A batch of tokens leased to each worker would spare the database more, but a worker's unspent
tokens are lost to the others until their lease ends, and a worker would have to hold slots of
the in-flight cap it may never use: the shards keep the rate and the cap what they were.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from castad_runtime import db, tables

quotas = tables.quotas
shards = tables.quota_shards
in_flight = tables.in_flight_counts
DECREASE = 0.5  # the rate is multiplied by this when the provider says "too many"
INCREASE_STEPS = 20  # calls that go through to climb from the lowest rate back to the highest
MAX_BLOCK_S = 3600.0  # the longest a Retry-After stops every call (as machine.MAX_RETRY_AFTER_S)
MAX_SHARDS = 16  # rows a provider's token bucket is split into, at most
SHARD_RATE_PER_S = 10.0  # a shard's share of the highest rate, at least
IN_FLIGHT_SHARDS = tables.IN_FLIGHT_SHARDS  # rows of in_flight_counts


@dataclasses.dataclass(frozen=True)
class Limits:
    provider: str
    max_rate_per_s: float
    min_rate_per_s: float
    burst: float
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.min_rate_per_s <= self.max_rate_per_s:
            raise ValueError("need 0 < min_rate_per_s <= max_rate_per_s")
        if self.burst < 1:
            raise ValueError("burst must be at least 1")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")

    @property
    def shards(self) -> int:
        """Rows the token bucket is split into.

        Each holds a whole token at least, and refills one within 1 / SHARD_RATE_PER_S seconds at the highest rate."""
        return max(1, min(MAX_SHARDS, math.floor(self.burst), math.floor(self.max_rate_per_s / SHARD_RATE_PER_S)))


NO_TOKEN = "no_token"  # the rate is spent for now
RETRY_AFTER = "retry_after"  # the provider asked to wait
IN_FLIGHT_CAP = "in_flight_cap"  # as many jobs at the provider as it allows


@dataclasses.dataclass(frozen=True)
class Gate:
    open: bool  # a call may go now
    new_work: bool  # a new attempt may submit work (fewer than max_in_flight jobs at the provider)
    closed_by: str | None = None  # why no call may go: NO_TOKEN or RETRY_AFTER
    shard: int | None = None  # the shard of the provider's bucket this claim holds, its token to spend


# A shard's tokens now: what it held, plus what its share of the provider's rate added since, up to its share
# of the burst. `q` is the provider's row, `s` the shard.
_REFILLED = "least(q.burst / q.shards, s.tokens + q.rate_per_s / q.shards * extract(epoch FROM now() - s.refilled_at))"

# A shard of the provider's bucket with a token, held for this claim: one no other claim holds if there is one
# ({wait} empty), else any ({wait} = no SKIP LOCKED, only when every shard with a token is held); nothing while
# a Retry-After blocks the provider.
_TAKE = f"""
SELECT s.shard, q.max_in_flight FROM quotas q JOIN quota_shards s ON s.provider = q.provider
WHERE q.provider = %(provider)s AND q.shards > s.shard AND NOT coalesce(q.blocked_until > now(), false)
    AND {_REFILLED} >= 1
ORDER BY random() LIMIT 1 FOR UPDATE OF s {{wait}}
"""
TAKE = _TAKE.format(wait="SKIP LOCKED")
TAKE_WAITING = _TAKE.format(wait="")

# Why no shard was free: the provider's block, and whether any shard has a token (held by other claims).
WHY_CLOSED = f"""
SELECT coalesce(q.blocked_until > now(), false) AS blocked,
    coalesce(bool_or({_REFILLED} >= 1), false) AS tokens_held
FROM quotas q JOIN quota_shards s ON s.provider = q.provider AND q.shards > s.shard
WHERE q.provider = %(provider)s GROUP BY q.blocked_until
"""

SPEND = f"""
UPDATE quota_shards s SET tokens = {_REFILLED} - 1, refilled_at = now()
FROM quotas q WHERE q.provider = s.provider AND s.provider = %(provider)s AND s.shard = %(shard)s
"""

# Every shard of the provider's bucket with a whole token that no other claim holds, held for a batch of probes
# (castad_runtime.stage.probes), with its whole tokens; nothing while a Retry-After blocks the provider.
HOLD_TOKENS = f"""
SELECT s.shard, floor({_REFILLED})::int AS tokens FROM quotas q JOIN quota_shards s ON s.provider = q.provider
WHERE q.provider = %(provider)s AND q.shards > s.shard AND NOT coalesce(q.blocked_until > now(), false)
    AND {_REFILLED} >= 1
ORDER BY s.shard FOR UPDATE OF s SKIP LOCKED
"""

SPEND_MANY = f"""
UPDATE quota_shards s SET tokens = {_REFILLED} - spent.tokens, refilled_at = now()
FROM quotas q, unnest(%(shards)s::int[], %(tokens)s::int[]) AS spent(shard, tokens)
WHERE q.provider = s.provider AND s.provider = %(provider)s AND s.shard = spent.shard
"""

# "Too many": every shard's tokens spent, so that nothing is called until they refill at the halved rate (or the
# Retry-After ends). The shards are locked in their order, so that two such answers at once cannot deadlock.
EMPTY = f"""
UPDATE quota_shards s SET tokens = least({_REFILLED}, 0), refilled_at = now()
FROM quotas q, (SELECT shard FROM quota_shards WHERE provider = %(provider)s ORDER BY shard FOR UPDATE) AS held
WHERE q.provider = s.provider AND s.provider = %(provider)s AND s.shard = held.shard
"""

# A row of the in-flight count below its cap, held for this claim: the trigger adds the claimed job to such a row.
ROOM = f"""
SELECT shard FROM in_flight_counts WHERE cap IS NULL OR jobs < cap
ORDER BY shard = mod(pg_backend_pid(), {IN_FLIGHT_SHARDS}) DESC LIMIT 1 FOR UPDATE SKIP LOCKED
"""


def configure(conn: sa.Connection, limits: Limits) -> None:
    """Set the limits at a service's start; the current rate is kept, within the new bounds."""
    insert = pg.insert(quotas).values(
        provider=limits.provider,
        max_in_flight=limits.max_in_flight,
        max_rate_per_s=limits.max_rate_per_s,
        min_rate_per_s=limits.min_rate_per_s,
        burst=limits.burst,
        rate_per_s=limits.max_rate_per_s,
        tokens=limits.burst,
        shards=limits.shards,
    )
    ex = insert.excluded
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=[quotas.c.provider],
            set_={
                "max_in_flight": ex.max_in_flight,
                "max_rate_per_s": ex.max_rate_per_s,
                "min_rate_per_s": ex.min_rate_per_s,
                "burst": ex.burst,
                "rate_per_s": sa.func.least(
                    ex.max_rate_per_s, sa.func.greatest(ex.min_rate_per_s, quotas.c.rate_per_s)
                ),
                "tokens": sa.func.least(ex.burst, quotas.c.tokens),
                "shards": ex.shards,
            },
        )
    )
    share = limits.burst / limits.shards
    rows = [{"provider": limits.provider, "shard": shard, "tokens": share} for shard in range(limits.shards)]
    new_shards = pg.insert(shards).values(rows)
    conn.execute(
        new_shards.on_conflict_do_update(
            index_elements=[shards.c.provider, shards.c.shard],
            set_={"tokens": sa.func.least(share, shards.c.tokens)},
        )
    )
    conn.execute(shards.delete().where(shards.c.provider == limits.provider, shards.c.shard >= limits.shards))
    _share_the_cap(conn, limits.max_in_flight)


def _share_the_cap(conn: sa.Connection, cap: int | None) -> None:
    """Give each row of the in-flight count its share of the cap.

    The jobs counted so far go to rows below their caps (any beyond the cap to the first row, which releases
    take from first), so that a row below its cap means room. Every row is held meanwhile, taken in their
    order (no deadlock with another start)."""
    rows = conn.execute(sa.select(in_flight.c.shard, in_flight.c.jobs).order_by(in_flight.c.shard).with_for_update())
    shares = list(rows)
    left = sum(row.jobs for row in shares)
    values = []
    for row in shares:
        share = None if cap is None else cap // len(shares) + (1 if row.shard < cap % len(shares) else 0)
        jobs = 0 if share is None else min(share, left)
        left -= jobs
        values.append({"row": row.shard, "share": share, "counted": jobs})
    values[0]["counted"] += left
    conn.execute(
        in_flight.update()
        .where(in_flight.c.shard == sa.bindparam("row"))
        .values(cap=sa.bindparam("share"), jobs=sa.bindparam("counted")),
        values,
    )


def gate(conn: sa.Connection, provider: str) -> Gate:
    """Hold a shard of the provider's bucket with a token for this claim, and say what it allows now.

    Under a cap on jobs in flight, a row of their count with room is held too, for the claim of new work."""
    params = {"provider": provider}
    row = db.run(conn, TAKE, params).fetchone()
    if row is None:
        why = db.run(conn, WHY_CLOSED, params).fetchone()
        if why is not None and why.blocked:
            return Gate(open=False, new_work=False, closed_by=RETRY_AFTER)
        if why is not None and why.tokens_held:  # every shard with a token is another claim's: wait for one
            row = db.run(conn, TAKE_WAITING, params).fetchone()
        if row is None:
            return Gate(open=False, new_work=False, closed_by=NO_TOKEN)
    if row.max_in_flight is None:
        return Gate(open=True, new_work=True, shard=row.shard)
    room = db.run(conn, ROOM).fetchone()
    return Gate(open=True, new_work=room is not None, shard=row.shard)


def spend(conn: sa.Connection, provider: str, held: Gate) -> None:
    """A claim took the token of the shard it holds."""
    db.run(conn, SPEND, {"provider": provider, "shard": held.shard})


@dataclasses.dataclass(frozen=True)
class Tokens:
    """Whole tokens of the provider's bucket held for a batch of calls: by shard, in the shards' order."""

    provider: str
    by_shard: dict[int, int]

    @property
    def count(self) -> int:
        return sum(self.by_shard.values())


def hold_tokens(conn: sa.Connection, provider: str) -> Tokens:
    """Hold every shard of the provider's bucket that has a whole token and that no other claim holds."""
    rows = db.run(conn, HOLD_TOKENS, {"provider": provider})
    return Tokens(provider, {row.shard: row.tokens for row in rows})


def spend_tokens(conn: sa.Connection, held: Tokens, used: int) -> None:
    """A batch made `used` calls (at most the tokens held): their tokens are taken from the held shards."""
    if not 0 <= used <= held.count:
        raise ValueError(f"{used} calls cannot be paid with the {held.count} tokens held")
    spent: dict[int, int] = {}
    for shard, tokens in held.by_shard.items():
        if used == 0:
            break
        spent[shard] = min(tokens, used)
        used -= spent[shard]
    if spent:
        params = {"provider": held.provider, "shards": list(spent), "tokens": list(spent.values())}
        db.run(conn, SPEND_MANY, params, prepare=db.REPLAN)


def jobs_in_flight(conn: sa.Connection) -> int:
    """Jobs RUNNING or AWAITING, as the triggers counted them (no count of the jobs table)."""
    return int(conn.execute(sa.select(sa.func.coalesce(sa.func.sum(in_flight.c.jobs), 0))).scalar_one())


def throttled(conn: sa.Connection, provider: str, retry_after_s: float) -> None:
    """The provider said "too many".

    Spend every token, halve the rate, and claim nothing before its Retry-After (at most an hour): without one,
    calls go again as the shards refill at the halved rate. Calls that were on their way when it said so do not
    halve it again: once per such window.
    """
    db.run(conn, EMPTY, {"provider": provider})  # at the rate before, as the tokens it held were refilled
    until = sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, min(max(retry_after_s, 0.0), MAX_BLOCK_S))
    blocked = sa.func.coalesce(quotas.c.blocked_until > sa.func.now(), False)
    conn.execute(
        quotas.update()
        .where(quotas.c.provider == provider)
        .values(
            rate_per_s=sa.case(
                (blocked, quotas.c.rate_per_s),
                else_=sa.func.greatest(quotas.c.min_rate_per_s, quotas.c.rate_per_s * DECREASE),
            ),
            blocked_until=sa.func.greatest(sa.func.coalesce(quotas.c.blocked_until, until), until),
            throttled=quotas.c.throttled + 1,
        )
    )


def relieved(conn: sa.Connection, provider: str) -> None:
    """A call went through: raise the rate by a step, up to its highest."""
    step = (quotas.c.max_rate_per_s - quotas.c.min_rate_per_s) / INCREASE_STEPS
    conn.execute(
        quotas.update()
        .where(quotas.c.provider == provider, quotas.c.rate_per_s < quotas.c.max_rate_per_s)
        .values(rate_per_s=sa.func.least(quotas.c.max_rate_per_s, quotas.c.rate_per_s + step))
    )


def state(conn: sa.Connection, provider: str) -> dict[str, Any]:
    """The provider's row as it is, its `tokens` those of its shards now (for tests and operators)."""
    row = conn.execute(sa.select(quotas).where(quotas.c.provider == provider)).one()
    tokens = db.run(
        conn,
        f"SELECT coalesce(sum({_REFILLED}), 0) FROM quotas q JOIN quota_shards s ON s.provider = q.provider"
        " AND q.shards > s.shard WHERE q.provider = %(provider)s",
        {"provider": provider},
    ).fetchone()
    assert tokens is not None
    return {**row._mapping, "tokens": float(tokens[0])}
