"""The operator's numbers.

Pipelines in flight and finished, each stage's queue, failures and durations, stuck attempts, dead letters,
throughput (admin: they span every tenant).
"""

from __future__ import annotations

from typing import Annotated

from castad_contracts import api
from fastapi import APIRouter, Query

from castad_api import errors, stats
from castad_api.deps import ADMIN_ONLY, AUTH_ERRORS, UNREADABLE, GatewayDep

router = APIRouter(
    prefix="/v1", tags=["operations"], dependencies=[ADMIN_ONLY], responses={**AUTH_ERRORS, **UNREADABLE}
)


@router.get("/stats", response_model=api.Stats)
def get_stats(
    gw: GatewayDep,
    window: Annotated[
        str,
        Query(
            max_length=20,
            description="how far back: 15m, 1h, 24h, 7d, or seconds (60 s to 7 days)",
            examples=["15m", "1h", "24h", "7d", "900"],
        ),
    ] = "1h",
) -> api.Stats:
    """The operator's numbers: what is in flight now, and how the window went.

    In flight now: pipelines by status, and per stage how many wait for it, run in it (stuck among them: RUNNING
    longer than CASTAD_API_STUCK_AFTER_S, the gateway not seeing leases) or wait for its next attempt. Over the
    window: pipelines created and ended, per stage its runs' outcomes, failure rate and duration percentiles (first
    start to end), its attempts' outcomes, errors by code and duration percentiles; dead letters and parked outbox
    rows; throughput per minute. From the gateway's own projection.
    """
    try:
        window_s = stats.parse_window(window)
    except errors.BadWindow as error:
        raise errors.invalid(("query", "window"), str(error), window) from None
    return stats.read(gw.engine, window_s, gw.config.stuck_after_s)
