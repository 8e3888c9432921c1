"""`castad review ID [--approve | --edit FILE | --regenerate [--note TEXT]] [--draft ID]`: a pipeline's review."""

from __future__ import annotations

import pathlib
from typing import Annotated, NoReturn

import pydantic
import typer
from castad_contracts import api

from castad_cli.terminal import connected, console, errors


def review(
    ctx: typer.Context,
    pipeline_id: str,
    approve: Annotated[bool, typer.Option("--approve", help="make the song of the draft as it is")] = False,
    edit: Annotated[
        pathlib.Path | None,
        typer.Option(help="make the song of the lyrics in FILE instead, exactly as written (the draft's text, edited)"),
    ] = None,
    regenerate: Annotated[bool, typer.Option("--regenerate", help="ask for a new draft")] = False,
    note: Annotated[str | None, typer.Option(help="with --regenerate: what to change")] = None,
    draft: Annotated[str | None, typer.Option(help="the draft decided on (default: the current one)")] = None,
) -> None:
    """Show the pipeline's draft waiting for review, or decide on it (exit 5 if it is not the one waiting)."""
    chosen = [name for name, given in (("approve", approve), ("edit", edit), ("regenerate", regenerate)) if given]
    if len(chosen) > 1:
        _refuse(f"give one of --approve, --edit and --regenerate, not {' and '.join('--' + c for c in chosen)}")
    lyrics = _read(edit) if edit is not None else None
    with connected(ctx) as client:
        shown = client.review(pipeline_id)
        if not chosen:
            _print(shown)
            return
        current = draft or (shown.draft.id if shown.draft else None)
        if current is None:
            errors.print(f"castad: pipeline {pipeline_id} has no draft yet", markup=False)
            raise typer.Exit(5)
        try:
            decision = api.ReviewDecision(draft=current, decision=chosen[0], lyrics=lyrics, note=note)
        except pydantic.ValidationError as error:
            for problem in error.errors():
                _refuse(f"{'.'.join(map(str, problem['loc']))}: {problem['msg']}")
        done = client.decide(pipeline_id, decision)
    console.print(f"pipeline {done.id}: {done.decision} of draft {done.draft} recorded ({done.status})")


def _read(path: pathlib.Path) -> str:
    try:
        return path.expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        _refuse(f"--edit {path}: {getattr(error, 'strerror', None) or type(error).__name__}")


def _refuse(message: str) -> NoReturn:
    errors.print(f"castad: {message}", markup=False)
    raise typer.Exit(2)


def _print(shown: api.ReviewView) -> None:
    asked = shown.asked
    console.print(f"review: lyrics, {asked.timeout_s} s per draft, then {asked.on_timeout}")
    made = shown.draft
    if made is None:
        console.print("no draft yet")
        return
    console.print(f"draft {made.id} (round {made.round}, {made.regenerations_left} new drafts left)")
    console.print(f"waits until {made.review_until:%Y-%m-%d %H:%M:%S %Z}, then {made.on_timeout}")
    if made.decision:
        by = f"key {made.decided_by_key_id}" if made.decided_by_key_id else "its timeout or a link"
        console.print(f"decided: {made.decision} ({by})")
    console.print()
    console.print(made.edited_text or made.text, markup=False, highlight=False)
