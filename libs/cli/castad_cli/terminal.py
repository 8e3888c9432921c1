"""What every `castad` command shares: where output goes, and a client of the chosen gateway."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from castad_cli import client as client_

console = Console(soft_wrap=True)  # a one-line answer stays one line in a pipe
errors = Console(stderr=True, soft_wrap=True, highlight=False)  # one line per error, never wrapped


@dataclasses.dataclass(frozen=True)
class Options:
    gateway: str
    actor: str
    api_key: str | None = None


@contextmanager
def connected(ctx: typer.Context) -> Iterator[client_.Client]:
    """A client of the gateway the command line chose (`castad --gateway URL --actor NAME ...`)."""
    options: Options = ctx.obj
    client = client_.Client(options.gateway, actor=options.actor, api_key=options.api_key)
    try:
        yield client
    finally:
        client.close()
