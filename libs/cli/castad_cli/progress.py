"""Live progress bars, one per stage, fed by the gateway's event stream."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from castad_contracts import events
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

RUNNING_SHARE = 10  # a started stage shows as 10 % until it completes


def watch(stream: Iterable[tuple[str, dict[str, Any]]], console: Console) -> dict[str, Any]:
    """Render progress until the stream ends; return the last event's data."""
    last: dict[str, Any] = {}
    with Progress(
        TextColumn("{task.fields[stage]:>8}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        tasks: dict[str, TaskID] = {
            stage.value: progress.add_task("waiting", total=100, stage=stage.value) for stage in events.STAGE_ORDER
        }
        for _, data in stream:
            last = data
            task = tasks.get(data.get("step", ""))
            if task is not None:
                completed, description = _describe(data)
                progress.update(task, completed=completed, description=description)
    return last


def _describe(data: dict[str, Any]) -> tuple[float, str]:
    status, attempt = data.get("status"), data.get("attempt")
    error = data.get("error") or {}
    if status == "started":
        return RUNNING_SHARE, f"[cyan]running[/] (attempt {attempt})"
    if status == "retrying":
        return 0, f"[yellow]retrying[/] after attempt {attempt}: {error.get('code')}"
    if status == "completed":
        size = (data.get("artifact") or {}).get("size", 0)
        return 100, f"[green]done[/] ({size:,} bytes)"
    if status == "failed":
        return 0, f"[red]failed[/] {error.get('code')}: {error.get('message')}"
    if status == "drafted":
        until = (data.get("draft") or {}).get("review_until", "?")
        return RUNNING_SHARE, f"[magenta]awaiting review[/] until {until} (castad review)"
    if status == "review_decided":
        return RUNNING_SHARE, f"[cyan]reviewed[/]: {(data.get('draft') or {}).get('decision')}"
    return 0, str(status)
