"""What a tenant used and may use: GET /v1/usage (usage.py)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from castad_contracts import api
from fastapi import APIRouter, HTTPException, Query, status

from castad_api import errors, keys, usage
from castad_api.deps import AUTH_ERRORS, UNREADABLE, GatewayDep, Reader

router = APIRouter(prefix="/v1", tags=["usage"], responses={**AUTH_ERRORS, **UNREADABLE})


@router.get(
    "/usage",
    response_model=api.Usage,
    response_model_by_alias=True,
    responses={403: {"model": api.Problem, "description": "another tenant's usage, asked by a key without admin"}},
)
def get_usage(
    gw: GatewayDep,
    who: Reader,
    from_: Annotated[
        dt.date | None, Query(alias="from", description="the first UTC day (default: the first of this month)")
    ] = None,
    to: Annotated[dt.date | None, Query(description="the last UTC day, counted too (default: today)")] = None,
    tenant: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=200,
            pattern=r"^[^\x00-\x1f\x7f]*$",
            description="an admin key: whose usage (default: every tenant's); any other: its own",
        ),
    ] = None,
) -> api.Usage:
    """What the key's tenant used per UTC day, by meter, with its estimated cost, its budgets and its weight.

    Counted from the stages' events as the gateway applies them: a pipeline as it is accepted, a provider's work as
    each attempt ends, seconds and bytes as each stage completes. An admin key reads every tenant's (`tenant` to
    read one); at most 366 days at once.
    """
    today = dt.datetime.now(dt.UTC).date()
    last = to or today
    first = from_ or last.replace(day=1)
    if first > last:
        raise errors.invalid(("query", "from"), f"{first} is after the last day asked for, {last}", from_)
    if (last - first).days >= usage.MAX_DAYS:
        raise errors.invalid(
            ("query", "to"), f"at most {usage.MAX_DAYS} days at once, not {(last - first).days + 1}", to
        )
    admin = who.may(keys.Scope.ADMIN)
    if tenant is not None and tenant != who.tenant and not admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "a key without admin reads its own tenant's usage only")
    whose = tenant if tenant is not None else (None if admin else who.tenant)
    with gw.engine.connect() as conn:
        return usage.report(conn, whose, first, last, gw.config.prices, gw.config.currency)
