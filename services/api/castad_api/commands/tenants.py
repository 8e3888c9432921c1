"""`python -m castad_api tenants budget|weight|list` (also `castad-admin tenants ...` locally).

A tenant's budgets and its weight in the stages' fair turns (usage.py), kept in the gateway's database.

In a cluster: `kubectl exec deploy/<release>-api -- python -m castad_api tenants budget acme --period month --cost 50`.
"""

from __future__ import annotations

from typing import Annotated

import typer
from castad_contracts import events
from castad_runtime import cli
from rich.console import Console

from castad_api import usage
from castad_api.commands.keys import gateway_db
from castad_api.settings import ApiSettings

app = typer.Typer(
    help="Set a tenant's budgets and its weight in the stages' fair turns.", no_args_is_help=True, add_completion=False
)
console = Console(soft_wrap=True)
Tenant = Annotated[str, typer.Argument(help="the tenant, as its API keys name it")]


def _tenant(tenant: str) -> str:
    if not tenant.strip():
        raise typer.BadParameter("a tenant is a non-empty name", param_hint="TENANT")
    return tenant


@app.command("budget")
def budget(
    tenant: Tenant,
    period: Annotated[str, typer.Option(help="day or month (UTC)")] = "month",
    pipelines: Annotated[int | None, typer.Option(min=0, help="pipelines it may make")] = None,
    song_seconds: Annotated[float | None, typer.Option(min=0, help="seconds of song it may have made")] = None,
    cost: Annotated[float | None, typer.Option(min=0, help="estimated cost it may reach (CASTAD_API_PRICES)")] = None,
) -> None:
    """Set the tenant's budget for a day or a month: its briefs past it are refused (402 or 429) until it resets.

    Limits left out have no limit; none at all removes the budget. Work already accepted is never refused.
    """
    if period not in usage.PERIODS:
        raise typer.BadParameter(f"day or month, not {period!r}", param_hint="--period")
    limits = usage.Limits(period, pipelines, song_seconds, cost)  # checked above
    with gateway_db(cli.load_settings(ApiSettings)) as conn:
        usage.set_budget(conn, _tenant(tenant), limits)
    set_ = [
        f"{name} {value:g}"
        for name, value in (("pipelines", pipelines), ("song seconds", song_seconds), ("cost", cost))
        if value is not None
    ]
    console.print(f"{tenant}: {usage.EVERY[period]} budget " + (", ".join(set_) if set_ else "removed"))


@app.command("weight")
def weight(
    tenant: Tenant,
    value: Annotated[int, typer.Argument(min=1, max=events.MAX_SHARE_WEIGHT, help="turns for another tenant's one")],
) -> None:
    """Set the tenant's weight in the stages' fair turns: its pipelines made from now on take turns by it."""
    with gateway_db(cli.load_settings(ApiSettings)) as conn:
        usage.set_weight(conn, _tenant(tenant), value)
    console.print(f"{tenant}: weight {value}")


@app.command("list")
def listing() -> None:
    """Every tenant with a weight or budget set, one a line, tab-separated.

    Its name, the label its metrics have (`tenant_ref`), its weight, then each budget."""
    config = cli.load_settings(ApiSettings)
    with gateway_db(config) as conn:
        for tenant, (tenant_weight, limits) in usage.settings(conn).items():
            budgets = [
                f"{limit.period}: pipelines={_shown(limit.pipelines)} song_seconds={_shown(limit.song_seconds)}"
                f" cost={_shown(limit.cost)}"
                for limit in limits
            ]
            row = [tenant, usage.metrics_label(tenant), str(tenant_weight), *budgets]
            console.print("\t".join(row), markup=False)


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
