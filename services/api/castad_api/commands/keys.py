"""`python -m castad_api keys create|list|revoke` (also `castad-admin keys ...` locally).

The gateway's API keys, kept in its database (keys.py), managed with its own settings (CASTAD_API_DATABASE_URL).

In a cluster: `kubectl exec deploy/<release>-api -- python -m castad_api keys create --tenant acme`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Annotated

import sqlalchemy as sa
import typer
from castad_runtime import cli, db
from rich.console import Console

from castad_api import keys
from castad_api.settings import ApiSettings

app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True, add_completion=False)
console = Console(soft_wrap=True)


@contextlib.contextmanager
def gateway_db(config: ApiSettings) -> Iterator[sa.Connection]:
    engine = db.make_engine(config.database_url, pool_size=1)
    try:
        with db.transaction(engine) as conn:
            yield conn
    finally:
        engine.dispose()


def create_key(config: ApiSettings, tenant: str, scopes: frozenset[keys.Scope], name: str) -> str:
    """A new key (shown this once)."""
    with gateway_db(config) as conn:
        return keys.create(conn, tenant, scopes, name).key


def revoke_key(config: ApiSettings, key_id: uuid.UUID) -> bool:
    """Revoke a key at once; False if there is no such key."""
    with gateway_db(config) as conn:
        return keys.revoke(conn, key_id)


def _scopes(value: str) -> frozenset[keys.Scope]:
    try:
        chosen = frozenset(keys.Scope(part.strip()) for part in value.split(",") if part.strip())
    except ValueError:
        chosen = frozenset()
    if not chosen:
        raise typer.BadParameter(f"a comma-separated list of {', '.join(keys.Scope)}")
    return chosen


@app.command("create")
def create(
    tenant: Annotated[str, typer.Option(help="whose pipelines the key sees")],
    scopes: Annotated[str, typer.Option(help="comma-separated: submit, read, operate, admin")] = "submit,read",
    name: Annotated[str, typer.Option(help="what the key is for")] = "",
) -> None:
    """Make a key; it is printed once, only its hash is kept."""
    if not tenant.strip():
        raise typer.BadParameter("a tenant is a non-empty name", param_hint="--tenant")
    console.print(create_key(cli.load_settings(ApiSettings), tenant, _scopes(scopes), name or f"{tenant} key"))


@app.command("list")
def list_keys(tenant: Annotated[str | None, typer.Option(help="only this tenant's")] = None) -> None:
    """Every key, one a line, tab-separated: id, tenant, scopes, its first characters, made, revoked, name."""
    with gateway_db(cli.load_settings(ApiSettings)) as conn:
        for row in keys.listing(conn, tenant):
            created, revoked = (f"{at:%Y-%m-%dT%H:%M}" if at else "-" for at in (row.created_at, row.revoked_at))
            fields = (str(row.id), row.tenant, ",".join(row.scopes), row.shown + "…", created, revoked, row.name)
            typer.echo("\t".join(fields))


@app.command("revoke")
def revoke(key_id: Annotated[uuid.UUID, typer.Argument(help="the key's id (keys list)")]) -> None:
    """Revoke a key at once (rotate: create the new one, move clients over, then revoke the old one)."""
    if not revoke_key(cli.load_settings(ApiSettings), key_id):
        console.print(f"no key {key_id}", style="red")
        raise typer.Exit(4)
    console.print(f"revoked {key_id}")
