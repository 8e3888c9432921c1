"""The command line every service shares: `python -m castad_<service> run|migrate|declare`."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import pika.exceptions
import pydantic
import typer
from castad_contracts import topology
from pydantic_settings import BaseSettings

from castad_runtime import messaging, redact, settings

S = TypeVar("S", bound=BaseSettings)


def load_settings(factory: type[S]) -> S:
    """Read settings or stop with every bad variable named; their secrets are masked wherever they appear."""
    try:
        loaded = factory()
    except pydantic.ValidationError as error:
        for problem in error.errors():
            field = str(problem["loc"][0])
            name = settings.env_var(factory, field) if field in factory.model_fields else field
            if field == settings.env_var(factory, "amqp_url"):
                name = settings.service_amqp_url(factory) or name
            value = redact.mask(repr(problem.get("input")))
            typer.echo(f"bad setting {name}={value}: {redact.mask(problem['msg'])}", err=True)
        raise typer.Exit(2) from None
    redact.known(
        *(value.get_secret_value() for value in vars(loaded).values() if isinstance(value, pydantic.SecretStr))
    )
    return loaded


def service_app(
    name: str,
    settings_factory: type[BaseSettings],
    run: Callable[[Any], None],
    migrations_dir: pathlib.Path | None,
) -> typer.Typer:
    app = typer.Typer(help=f"Castad {name} service.", no_args_is_help=True, add_completion=False)

    @app.callback()
    def main() -> None:
        """Settings come from CASTAD_* environment variables (see docs/operating/settings.md)."""

    @app.command("run")
    def run_command() -> None:
        """Run the service until SIGTERM or Ctrl-C."""
        try:
            run(load_settings(settings_factory))
        except messaging.TopologyMismatch as error:  # an operator's step is missing: one line, no traceback
            typer.echo(f"{name}: cannot start: {error}", err=True)
            raise typer.Exit(3) from None

    @app.command("declare")
    def declare_command(
        amqp_url: Annotated[
            str,
            typer.Option(
                envvar="CASTAD_TOPOLOGY_AMQP_URL",
                show_default=False,
                help="a broker user that may configure the vhost (its own user cannot declare its queues anew)",
            ),
        ],
    ) -> None:
        """Declare the service's queues and bindings, and the exchanges every service shares (a chart's hook)."""
        config: Any = load_settings(settings_factory)
        try:
            messaging.declare_as_administrator(amqp_url, topology.Topology(config.namespace), name)
        except messaging.TopologyMismatch as error:
            typer.echo(f"{name}: cannot declare: {error}", err=True)
            raise typer.Exit(3) from None
        except (pika.exceptions.AMQPError, OSError) as error:
            typer.echo(f"{name}: cannot declare: broker: {redact.mask(str(error) or type(error).__name__)}", err=True)
            raise typer.Exit(3) from None
        typer.echo(f"{name}: queues and bindings declared in {config.namespace}")

    if migrations_dir is not None:

        @app.command("migrate")
        def migrate_command() -> None:
            """Create the service's database if missing and apply every migration."""
            # Imported here: Alembic would add half a second to every start of every service.
            from castad_runtime import migrations

            config: Any = load_settings(settings_factory)
            database_url = str(config.database_url)
            migrations.ensure_database(database_url)
            migrations.upgrade(database_url, migrations_dir)
            if config.outbox_relay_role is not None:
                migrations.restrict_access(database_url, config.outbox_relay_role)
                typer.echo(f"{name}: database open to its owner and {config.outbox_relay_role} only")
            typer.echo(f"{name}: database migrated")

    if issubclass(settings_factory, settings.StoreSettings):

        @app.command("relayout")
        def relayout_command() -> None:
            """Move the artifacts a release up to 0.2 kept in each pipeline's folder to their stages' places.

            Once, after every replica of every service runs this release, with the whole volume (or bucket prefix)
            writable; again is harmless. Until then a stage given only its own place cannot read such files.
            """
            from castad_runtime import artifacts, outages

            store = artifacts.make_store(load_settings(settings_factory))
            try:
                moved = store.relayout()
            except (outages.StoreUnavailable, OSError) as error:
                typer.echo(f"{name}: cannot move the artifacts: {redact.describe(error)}", err=True)
                raise typer.Exit(3) from None
            typer.echo(f"{name}: {moved} artifacts moved to their stages' places")

    return app
