"""`castad submit | watch ID | status ID`."""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
from typing import Annotated

import pydantic
import typer
from castad_contracts import brief
from rich.console import Console
from rich.table import Table

from castad_cli import client as client_
from castad_cli import progress

app = typer.Typer(help="Talk to a Castad gateway.", no_args_is_help=True, add_completion=False)
console = Console()
GatewayOption = Annotated[str, typer.Option("--gateway", envvar="CASTAD_GATEWAY_URL", help="base URL of the gateway")]
DEFAULT_GATEWAY = "http://127.0.0.1:8000"


@app.command()
def submit(
    customer_name: Annotated[str, typer.Option(help="business name")],
    region: Annotated[str, typer.Option(help="town or district")],
    detail_region_info: Annotated[str, typer.Option(help="what the place offers")] = "",
    language: brief.Language = brief.Language.KOREAN,
    genre: brief.Genre = brief.Genre.KPOP,
    orientation: brief.Orientation = brief.Orientation.VERTICAL,
    duration_s: int = brief.DEFAULT_DURATION_S,
    idempotency_key: Annotated[str | None, typer.Option(help="default: a new random key")] = None,
    watch_: Annotated[bool, typer.Option("--watch/--no-watch", help="follow progress until done")] = True,
    gateway: GatewayOption = DEFAULT_GATEWAY,
) -> None:
    """Submit a brief; by default follow it to the end."""
    try:
        body = brief.Brief(
            customer_name=customer_name,
            region=region,
            detail_region_info=detail_region_info,
            language=language,
            genre=genre,
            orientation=orientation,
            duration_s=duration_s,
        )
    except pydantic.ValidationError as error:
        for problem in error.errors():
            console.print(f"[red]{'.'.join(map(str, problem['loc']))}: {problem['msg']}")
        raise typer.Exit(2) from None
    with _client(gateway) as client:
        accepted = client.submit(body, idempotency_key)
        console.print(f"pipeline [bold]{accepted.id}[/] {accepted.status}")
        if watch_:
            raise typer.Exit(_watch(client, accepted.id))


@app.command()
def watch(pipeline_id: str, gateway: GatewayOption = DEFAULT_GATEWAY) -> None:
    """Live progress bars of a pipeline until it ends; exit status 1 if it failed."""
    with _client(gateway) as client:
        raise typer.Exit(_watch(client, pipeline_id))


@app.command()
def status(pipeline_id: str, gateway: GatewayOption = DEFAULT_GATEWAY) -> None:
    """Status, attempts, errors and artifacts of a pipeline."""
    with _client(gateway) as client:
        view = client.status(pipeline_id)
    table = Table(title=f"{view.id}: {view.status} ({view.progress}%)")
    for column in ("stage", "status", "attempts", "last error", "artifact"):
        table.add_column(column)
    for stage in view.stages:
        error = f"{stage.last_error_code}: {stage.last_error_message}" if stage.last_error_code else ""
        artifact = f"{_local_path(stage.artifact.uri)} ({stage.artifact.size:,} B)" if stage.artifact else ""
        table.add_row(stage.stage.value, stage.status, str(stage.attempts), error, artifact)
    console.print(table)


def _watch(client: client_.Client, pipeline_id: str) -> int:
    last = progress.watch(client.events(pipeline_id), console)
    final = client.status(pipeline_id)
    if final.status == "SUCCEEDED":
        video = next(s.artifact for s in final.stages if s.stage.value == "video")
        assert video is not None
        console.print(f"[green]done[/]: {_local_path(video.uri)}", soft_wrap=True)
        return 0
    console.print(f"[red]{final.status}[/]: {final.error_code}: {final.error_message} ({last.get('step')})")
    return 1


def _local_path(uri: str) -> str:
    parsed = urllib.parse.urlparse(uri)
    return urllib.request.url2pathname(parsed.path) if parsed.scheme == "file" else uri


class _client:
    def __init__(self, gateway: str) -> None:
        self.client = client_.Client(os.environ.get("CASTAD_GATEWAY_URL", gateway))

    def __enter__(self) -> client_.Client:
        return self.client

    def __exit__(self, *exc: object) -> None:
        self.client.close()


@app.callback()
def _errors() -> None:
    """Exit with a readable message on gateway errors."""


def main() -> None:
    try:
        app()
    except client_.GatewayError as error:
        console.print(f"[red]gateway: {error}")
        raise SystemExit(1) from None
