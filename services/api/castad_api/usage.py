"""What each tenant used, what it may use, and its weight in the stages' fair turns.

- **Metering.** Each UTC day, per tenant, by meter (api.Meter): the pipelines it made, counted as each is accepted;
  and from the stages' own events, applied once each by the projection: the requests for work each stage sent its
  provider (`provider_calls` of every event that ends an attempt), the seconds of song and of video made (a video's
  seconds once for each format), and the bytes of the files each stage delivered. A stage a remake reused made
  nothing again: its seconds are not counted, its copied files are. The estimated cost is each meter times its price
  (CASTAD_API_PRICES), worked out when read, so a new price table prices the past as well.
- **Budgets.** Per tenant, per UTC day and month, at most so many pipelines, seconds of song and estimated cost
  (castad-admin tenants budget). A creation over one is refused (`errors.OverBudget`: 429 for the pipelines, whose
  count is exact; 402 for seconds and cost, which are known once the work is made, so work accepted before the
  limit was reached may take the tenant past it). A budget's change never touches work already accepted.
- **Weights.** A tenant's weight (castad-admin tenants weight) goes with each of its pipelines to the stages
  (events.Share): a tenant of weight 3 gets three of their turns for another's one.

Concurrent creations of a tenant with budgets are counted one after the other (`admit`), so a budget's count of
pipelines is exact however many replicas create at once.
"""

from __future__ import annotations

import calendar
import dataclasses
import datetime as dt
import hashlib
import random
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from castad_contracts import api, events
from castad_runtime import db

from castad_api import errors, tables

Prices = Mapping[api.Meter, float]
PERIODS: tuple[api.BudgetPeriod, ...] = ("day", "month")
EVERY = {"day": "daily", "month": "monthly"}
MAX_DAYS = 366  # the longest span GET /v1/usage reads at once

# Added to what a tenant used on a day, one row a meter and shard (a statement for any number of rows; a day left
# null is the database's today, UTC). A transaction adds to the rows of one shard, chosen at random, in the order of
# their keys: two transactions adding to one tenant's day wait for each other only if they chose the same shard,
# and never deadlock.
SHARDS = 16
ADD = """
INSERT INTO usage (tenant, day, meter, shard, amount)
SELECT tenant, coalesce(day, (now() AT TIME ZONE 'UTC')::date), meter, %s, amount
FROM unnest(%s::text[], %s::date[], %s::text[], %s::float8[]) AS added(tenant, day, meter, amount)
ORDER BY 1, 2, 3
ON CONFLICT (tenant, day, meter, shard) DO UPDATE SET amount = usage.amount + EXCLUDED.amount
"""


def metered(payload: events.Payload, stage: events.Stage, reused: bool) -> dict[api.Meter, float]:
    """What a stage's event says its stage used (`reused`: a remake's stage that copied what it had made before)."""
    amounts: dict[api.Meter, float] = {}
    if calls := getattr(payload, "provider_calls", None):
        amounts[api.calls_meter(stage)] = calls
    if not isinstance(payload, events.StageCompleted):
        return amounts
    files = [payload.artifact]
    if isinstance(payload, events.SongCompleted) and not reused:
        amounts[api.Meter.SONG_SECONDS] = payload.song_duration_s
    if isinstance(payload, events.VideoCompleted):
        renders = payload.renders()
        files = [file for render in renders for file in (render.artifact, render.poster) if file is not None]
        files += [fetched.file for fetched in payload.fetched_photos]
        if payload.duration_s is not None and not reused:
            amounts[api.Meter.VIDEO_SECONDS] = payload.duration_s * len(renders)
    amounts[api.Meter.STORED_BYTES] = sum(file.size for file in files)
    return amounts


def add(conn: sa.Connection, used: Iterable[tuple[str, dt.date | None, api.Meter, float]]) -> None:
    """Add to what tenants used: (tenant, day, meter, amount) each (a day of None: today, by the database's clock)."""
    rows = [row for row in used if row[3]]
    if rows:
        tenants, days, meters, amounts = (list(column) for column in zip(*rows, strict=True))
        shard = random.randrange(SHARDS)
        db.run(conn, ADD, (shard, tenants, days, [meter.value for meter in meters], [float(n) for n in amounts]))


def cost(amounts: Mapping[api.Meter, float], prices: Prices) -> float:
    return round(sum(amount * prices.get(meter, 0.0) for meter, amount in amounts.items()), 6)


def _meters(amounts: Mapping[api.Meter, float], prices: Prices) -> api.Meters:
    counted = {meter.value: amounts.get(meter, 0) for meter in api.Meter}
    whole = {name: int(value) for name, value in counted.items() if name not in ("song_seconds", "video_seconds")}
    return api.Meters(**{**counted, **whole}, estimated_cost=cost(amounts, prices))


def _used(conn: sa.Connection, tenant: str | None, first: dt.date, last: dt.date) -> list[Any]:
    statement = sa.select(tables.usage).where(tables.usage.c.day.between(first, last))
    if tenant is not None:
        statement = statement.where(tables.usage.c.tenant == tenant)
    return list(conn.execute(statement.order_by(tables.usage.c.day, tables.usage.c.tenant)))


def _summed(rows: Iterable[Any]) -> dict[api.Meter, float]:
    summed: dict[api.Meter, float] = {}
    for row in rows:
        meter = api.Meter(row.meter)
        summed[meter] = summed.get(meter, 0.0) + row.amount
    return summed


def report(
    conn: sa.Connection, tenant: str | None, first: dt.date, last: dt.date, prices: Prices, currency: str
) -> api.Usage:
    """What `tenant` (None: every tenant) used from `first` to `last`, UTC days both, with its budgets now."""
    rows = _used(conn, tenant, first, last)
    by_day: dict[tuple[dt.date, str], list[Any]] = {}
    for row in rows:
        by_day.setdefault((row.day, row.tenant), []).append(row)
    days = [
        api.UsageDay(day=day, tenant=who, **_meters(_summed(kept), prices).model_dump())
        for (day, who), kept in by_day.items()
    ]
    return api.Usage(
        tenant=tenant,
        from_=first,
        to=last,
        currency=currency,
        prices=dict(prices),
        days=days,
        total=_meters(_summed(rows), prices),
        weight=None if tenant is None else weight(conn, tenant),
        budgets=[] if tenant is None else budgets(conn, tenant, prices),
    )


def period_of(period: api.BudgetPeriod, now: dt.datetime) -> tuple[dt.date, dt.datetime]:
    """The first day of the UTC day or month `now` is in, and when it ends."""
    today = now.astimezone(dt.UTC).date()
    if period == "day":
        first, ends = today, today + dt.timedelta(days=1)
    else:
        first = today.replace(day=1)
        ends = first + dt.timedelta(days=calendar.monthrange(first.year, first.month)[1])
    return first, dt.datetime.combine(ends, dt.time(), dt.UTC)


@dataclasses.dataclass(frozen=True)
class Limits:
    """A tenant's budget for a period, as set."""

    period: api.BudgetPeriod
    pipelines: int | None
    song_seconds: float | None
    cost: float | None


def _limits(conn: sa.Connection, tenant: str) -> list[Limits]:
    rows = conn.execute(
        sa.select(tables.budgets).where(tables.budgets.c.tenant == tenant).order_by(tables.budgets.c.period)
    )
    return [Limits(row.period, row.pipelines, row.song_seconds, row.cost) for row in rows]


def budgets(
    conn: sa.Connection,
    tenant: str,
    prices: Prices,
    now: dt.datetime | None = None,
    set_limits: list[Limits] | None = None,
) -> list[api.Budget]:
    """The tenant's budgets (`set_limits`, if the caller read them already), each with what it used this period."""
    now = now or dt.datetime.now(dt.UTC)
    shown = []
    for limits in _limits(conn, tenant) if set_limits is None else set_limits:
        first, resets_at = period_of(limits.period, now)
        used = _meters(_summed(_used(conn, tenant, first, now.astimezone(dt.UTC).date())), prices)
        shown.append(api.Budget(**dataclasses.asdict(limits), used=used, resets_at=resets_at))
    return shown


def admit(conn: sa.Connection, tenant: str, prices: Prices) -> None:
    """Count a pipeline the tenant makes now, in its creation's transaction; OverBudget if a budget of its refuses.

    A tenant with budgets takes a lock of its own first (a transaction-level advisory lock), so that its concurrent
    creations, on any replica, are counted one after the other, each after the ones before committed; the day and
    the month are the database's (UTC)."""
    limits = _limits(conn, tenant)
    if limits:
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(f"castad-budget:{tenant}", 0))))
    add(conn, [(tenant, None, api.Meter.PIPELINES, 1)])
    if not limits:
        return
    now = conn.execute(sa.select(sa.func.now())).scalar_one()
    this_one = prices.get(api.Meter.PIPELINES, 0.0)  # what the pipeline costs by being made
    for budget in budgets(conn, tenant, prices, now, limits):
        used, which = budget.used, f"{tenant}'s {EVERY[budget.period]}"
        resets = f"it resets at {budget.resets_at.isoformat()}"
        if budget.pipelines is not None and used.pipelines > budget.pipelines:
            raise errors.OverBudget(
                f"{which} budget of {budget.pipelines} pipelines is reached; {resets}", budget.resets_at, payment=False
            )
        if budget.song_seconds is not None and used.song_seconds >= budget.song_seconds:
            raise errors.OverBudget(
                f"{which} budget of {budget.song_seconds:g} seconds of song is reached ({used.song_seconds:.0f} s"
                f" made); {resets}",
                budget.resets_at,
                payment=True,
            )
        before = used.estimated_cost - this_one
        if budget.cost is not None and (before >= budget.cost or used.estimated_cost > budget.cost):
            raise errors.OverBudget(
                f"{which} budget of {budget.cost:g} in estimated cost is reached ({before:.2f} used); {resets}",
                budget.resets_at,
                payment=True,
            )


def metrics_label(tenant: str) -> str:
    """The tenant as the gateway's metrics name it: a digest of its name, since /metrics names no tenant."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:12]


def weight(conn: sa.Connection, tenant: str) -> int:
    """The tenant's weight in the stages' fair turns (1 unless an operator set another)."""
    found = conn.execute(sa.select(tables.tenants.c.weight).where(tables.tenants.c.tenant == tenant)).scalar()
    return 1 if found is None else int(found)


def share(conn: sa.Connection, tenant: str) -> events.Share:
    """Whose work a pipeline of `tenant` is, as the stages take their turns (events.Share)."""
    return events.Share(tenant=tenant, weight=weight(conn, tenant))


def set_weight(conn: sa.Connection, tenant: str, new: int) -> None:
    """Set the tenant's weight: its pipelines made from now on take their turns by it."""
    statement = sa.dialects.postgresql.insert(tables.tenants).values(tenant=tenant, weight=new)
    conn.execute(
        statement.on_conflict_do_update(index_elements=["tenant"], set_={"weight": new, "updated_at": sa.func.now()})
    )


def set_budget(conn: sa.Connection, tenant: str, limits: Limits) -> None:
    """Set (or, with no limit at all, remove) the tenant's budget for a period."""
    where = (tables.budgets.c.tenant == tenant, tables.budgets.c.period == limits.period)
    if limits.pipelines is None and limits.song_seconds is None and limits.cost is None:
        conn.execute(tables.budgets.delete().where(*where))
        return
    values = {"pipelines": limits.pipelines, "song_seconds": limits.song_seconds, "cost": limits.cost}
    statement = sa.dialects.postgresql.insert(tables.budgets).values(tenant=tenant, period=limits.period, **values)
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=["tenant", "period"], set_={**values, "updated_at": sa.func.now()}
        )
    )


def settings(conn: sa.Connection) -> dict[str, tuple[int, list[Limits]]]:
    """Every tenant an operator set anything of: its weight and budgets."""
    weights = {row.tenant: int(row.weight) for row in conn.execute(sa.select(tables.tenants))}
    limits: dict[str, list[Limits]] = {}
    for row in conn.execute(sa.select(tables.budgets).order_by(tables.budgets.c.tenant, tables.budgets.c.period)):
        limits.setdefault(row.tenant, []).append(Limits(row.period, row.pipelines, row.song_seconds, row.cost))
    return {tenant: (weights.get(tenant, 1), limits.get(tenant, [])) for tenant in sorted({*weights, *limits})}


def budget_ratios(conn: sa.Connection, prices: Prices) -> list[tuple[str, api.BudgetPeriod, str, float]]:
    """Each tenant's budgets used so far, as a share of their limit: (tenant, period, limit, ratio) each."""
    ratios = []
    for tenant, (_, set_limits) in settings(conn).items():
        if not set_limits:
            continue
        for budget in budgets(conn, tenant, prices, set_limits=set_limits):
            used = budget.used
            for name, limit, value in (
                ("pipelines", budget.pipelines, used.pipelines),
                ("song_seconds", budget.song_seconds, used.song_seconds),
                ("cost", budget.cost, used.estimated_cost),
            ):
                if limit:
                    ratios.append((tenant, budget.period, name, value / limit))
    return ratios
