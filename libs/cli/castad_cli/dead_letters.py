"""`castad dead-letters list | show ID | replay ID... | replay --all | discard ID --reason`."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from castad_contracts import api
from rich.table import Table

from castad_cli.terminal import connected, console, errors

app = typer.Typer(help="Messages no queue could handle, and outbox rows the relay parked.", no_args_is_help=True)


@app.command("list")
def list_(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="dead, replayed or discarded")] = "dead",
    service: str | None = None,
    event_type: Annotated[str | None, typer.Option("--type", help="event type")] = None,
    reason: Annotated[str | None, typer.Option(help="a part of the reason")] = None,
    pipeline: str | None = None,
    limit: int = 50,
) -> None:
    """Dead letters, newest first."""
    with connected(ctx) as client:
        page = client.dead_letters(
            status=status, service=service, event_type=event_type, reason=reason, pipeline_id=pipeline, limit=limit
        )
    table = Table(title=f"{len(page.items)} dead letters" + (" (more: narrow the filter)" if page.next_cursor else ""))
    for column in ("id", "status", "kind", "service", "event", "pipeline", "reason", "received"):
        table.add_column(column)
    for item in page.items:
        event = f"{item.event_type} v{item.schema_version}" if item.event_type else ""
        table.add_row(
            str(item.id),
            item.status,
            item.kind,
            item.service or "",
            event,
            item.pipeline_id or "",
            item.reason,
            item.received_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    console.print(table)


@app.command()
def show(ctx: typer.Context, letter_id: int) -> None:
    """A dead letter with its headers, body and what was done with it."""
    with connected(ctx) as client:
        letter = client.dead_letter(letter_id)
    console.print(f"[bold]dead letter {letter.id}[/] ({letter.kind}, {letter.status}): {letter.reason}", markup=True)
    for name in ("service", "queue", "event_type", "schema_version", "event_id", "pipeline_id", "received_at"):
        console.print(f"  {name}: {getattr(letter, name)}", markup=False, highlight=False)
    console.print(f"  headers: {json.dumps(letter.headers, ensure_ascii=False)}", markup=False, highlight=False)
    cut = " (cut)" if letter.body_truncated else ""
    console.print(f"  body ({letter.body_encoding}, {letter.body_size} bytes{cut}):", markup=False)
    console.print(letter.body, markup=False, highlight=False)
    for action in letter.actions:
        console.print(
            f"  {action.at:%Y-%m-%d %H:%M:%S} {action.action} by {action.actor}"
            + (f" (key {action.key_name})" if action.key_name else "")
            + f": {action.detail}",
            markup=False,
        )


@app.command()
def replay(
    ctx: typer.Context,
    letter_ids: Annotated[list[int] | None, typer.Argument(help="dead letters to replay")] = None,
    all_: Annotated[bool, typer.Option("--all", help="every dead letter still dead that matches the filters")] = False,
    service: str | None = None,
    event_type: Annotated[str | None, typer.Option("--type", help="event type")] = None,
    reason: Annotated[str | None, typer.Option(help="a part of the reason")] = None,
    pipeline: str | None = None,
    limit: int = 100,
) -> None:
    """Send dead letters back where they came from (after the cause was fixed)."""
    if bool(letter_ids) == all_:
        errors.print("castad: give dead letter ids, or --all with filters")
        raise typer.Exit(2)
    with connected(ctx) as client:
        if all_:
            selection = api.DeadLetterFilter(
                service=service, event_type=event_type, reason=reason, pipeline_id=pipeline, limit=limit
            )
            done = client.replay_matching(selection)
            console.print(f"replayed {len(done.replayed)}: {', '.join(map(str, done.replayed)) or 'none'}")
            for letter_id, why in done.refused.items():
                errors.print(f"castad: dead letter {letter_id} not replayed: {why}", markup=False)
            if done.refused:
                raise typer.Exit(1)
            return
        for letter_id in letter_ids or []:
            console.print(f"dead letter {letter_id}: {client.replay(letter_id).detail}", markup=False)


@app.command()
def discard(
    ctx: typer.Context, letter_id: int, reason: Annotated[str, typer.Option(help="why it is given up")]
) -> None:
    """Give up on a dead letter, with a reason."""
    with connected(ctx) as client:
        letter = client.discard(letter_id, reason)
    console.print(f"dead letter {letter.id}: {letter.status}")
