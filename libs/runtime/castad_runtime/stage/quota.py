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
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from castad_runtime import tables

quotas = tables.quotas
jobs = tables.jobs
DECREASE = 0.5  # the rate is multiplied by this when the provider says "too many"
INCREASE_STEPS = 20  # calls that go through to climb from the lowest rate back to the highest
MAX_BLOCK_S = 3600.0  # the longest a Retry-After stops every call (as machine.MAX_RETRY_AFTER_S)


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


NO_TOKEN = "no_token"  # the rate is spent for now
RETRY_AFTER = "retry_after"  # the provider asked to wait
IN_FLIGHT_CAP = "in_flight_cap"  # as many jobs at the provider as it allows


@dataclasses.dataclass(frozen=True)
class Gate:
    open: bool  # a call may go now
    new_work: bool  # a new attempt may submit work (fewer than max_in_flight jobs at the provider)
    closed_by: str | None = None  # why no call may go: NO_TOKEN or RETRY_AFTER


def _refilled() -> sa.ColumnElement[float]:
    """Tokens now: what the bucket held, plus what its rate added since, up to its size."""
    elapsed = sa.func.extract("epoch", sa.func.now() - quotas.c.refilled_at)
    return sa.func.least(quotas.c.burst, quotas.c.tokens + quotas.c.rate_per_s * elapsed)


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
            },
        )
    )


def gate(conn: sa.Connection, provider: str) -> Gate:
    """Lock the provider's row for this claim and say what it allows now."""
    row = conn.execute(
        sa.select(
            _refilled().label("tokens"),
            sa.func.coalesce(quotas.c.blocked_until > sa.func.now(), False).label("blocked"),
            quotas.c.max_in_flight,
        )
        .where(quotas.c.provider == provider)
        .with_for_update()
    ).one()
    if row.blocked or row.tokens < 1:
        return Gate(open=False, new_work=False, closed_by=RETRY_AFTER if row.blocked else NO_TOKEN)
    if row.max_in_flight is None:
        return Gate(open=True, new_work=True)
    in_flight = conn.execute(sa.select(sa.func.count()).where(jobs.c.status.in_(["RUNNING", "AWAITING"]))).scalar_one()
    return Gate(open=True, new_work=in_flight < row.max_in_flight)


def spend(conn: sa.Connection, provider: str) -> None:
    """A claim took a token."""
    conn.execute(
        quotas.update().where(quotas.c.provider == provider).values(tokens=_refilled() - 1, refilled_at=sa.func.now())
    )


def throttled(conn: sa.Connection, provider: str, retry_after_s: float) -> None:
    """The provider said "too many".

    Halve the rate, and claim nothing before its Retry-After (at most an hour). Calls that were on their way when
    it said so do not halve it again: once per such window.
    """
    until = sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, min(max(retry_after_s, 0.0), MAX_BLOCK_S))
    blocked = sa.func.coalesce(quotas.c.blocked_until > sa.func.now(), False)
    conn.execute(
        quotas.update()
        .where(quotas.c.provider == provider)
        .values(
            tokens=sa.func.least(_refilled(), 0.0),
            refilled_at=sa.func.now(),
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
        .values(
            tokens=_refilled(),
            refilled_at=sa.func.now(),
            rate_per_s=sa.func.least(quotas.c.max_rate_per_s, quotas.c.rate_per_s + step),
        )
    )


def state(conn: sa.Connection, provider: str) -> dict[str, object]:
    """The provider's row as it is (for tests and operators)."""
    row = conn.execute(sa.select(quotas).where(quotas.c.provider == provider)).one()
    return dict(row._mapping)
