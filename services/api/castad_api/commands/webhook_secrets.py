"""`python -m castad_api webhook-secrets ...`: manage each tenant's webhook secrets.

The commands are create, rotate, list and revoke (also `castad-admin webhook-secrets ...` locally). Each tenant's
Standard Webhooks secrets (webhook_secrets.py) are kept sealed in the gateway's database with
CASTAD_API_WEBHOOK_SECRETS_KEY, which this command needs as the gateway does.

A secret is printed once, when it is made: hand it to the tenant, whose receiver verifies its notices with it.
In a cluster: `kubectl exec deploy/<release>-api -- python -m castad_api webhook-secrets create --tenant acme`.
"""

from __future__ import annotations

import uuid
from typing import Annotated

import typer
from castad_runtime import cli
from rich.console import Console

from castad_api import webhook_secrets
from castad_api.commands.keys import gateway_db
from castad_api.settings import ApiSettings

app = typer.Typer(
    help="Create, rotate, list and revoke each tenant's webhook secrets.", no_args_is_help=True, add_completion=False
)
console = Console(soft_wrap=True)


def _sealer(config: ApiSettings) -> webhook_secrets.Sealer:
    if config.webhook_secrets_key is None:
        raise typer.BadParameter("CASTAD_API_WEBHOOK_SECRETS_KEY is not set: it seals the secrets (the gateway's own)")
    return webhook_secrets.Sealer.of(config.webhook_secrets_key.get_secret_value())


def create_secret(config: ApiSettings, tenant: str) -> str:
    """The tenant's first secret (shown this once); webhook_secrets.Exists if it has one."""
    sealer = _sealer(config)
    with gateway_db(config) as conn:
        return webhook_secrets.create(conn, sealer, tenant).secret


def rotate_secret(config: ApiSettings, tenant: str, overlap_s: float = webhook_secrets.DEFAULT_OVERLAP_S) -> str:
    """A new secret (shown this once); the current one signs beside it for `overlap_s` more."""
    sealer = _sealer(config)
    with gateway_db(config) as conn:
        return webhook_secrets.rotate(conn, sealer, tenant, overlap_s).secret


def _tenant(value: str) -> str:
    if not value.strip():
        raise typer.BadParameter("a tenant is a non-empty name", param_hint="--tenant")
    return value


Tenant = Annotated[str, typer.Option(help="whose notices the secret signs")]


@app.command("create")
def create(tenant: Tenant) -> None:
    """Make a tenant's secret; it is printed once, kept only sealed."""
    try:
        secret = create_secret(cli.load_settings(ApiSettings), _tenant(tenant))
    except webhook_secrets.Exists as error:
        console.print(f"{error}: castad-admin webhook-secrets rotate --tenant {tenant}", style="red")
        raise typer.Exit(4) from None
    console.print(secret)


@app.command("rotate")
def rotate(
    tenant: Tenant,
    overlap_s: Annotated[
        float, typer.Option(min=0, help="how long the current secret still signs beside the new one")
    ] = webhook_secrets.DEFAULT_OVERLAP_S,
) -> None:
    """Make a tenant's next secret (printed once); notices carry a signature with each until the overlap ends."""
    console.print(rotate_secret(cli.load_settings(ApiSettings), _tenant(tenant), overlap_s))


@app.command("list")
def list_secrets(tenant: Annotated[str | None, typer.Option(help="only this tenant's")] = None) -> None:
    """Every secret, never its value, one a line, tab-separated: id, tenant, made, valid until (- : until rotated)."""
    with gateway_db(cli.load_settings(ApiSettings)) as conn:
        for row in webhook_secrets.listing(conn, tenant):
            made, until = (f"{at:%Y-%m-%dT%H:%M:%S}" if at else "-" for at in (row.created_at, row.expires_at))
            typer.echo("\t".join((str(row.id), row.tenant, made, until)))


@app.command("revoke")
def revoke(secret_id: Annotated[uuid.UUID, typer.Argument(help="the secret's id (webhook-secrets list)")]) -> None:
    """End a secret now: an overlap ended early, or a secret that leaked."""
    with gateway_db(cli.load_settings(ApiSettings)) as conn:
        found = webhook_secrets.revoke(conn, secret_id)
    if not found:
        console.print(f"no webhook secret {secret_id}", style="red")
        raise typer.Exit(4)
    console.print(f"revoked {secret_id}")
