"""`python -m castad_local.fakes chat --port 8090`: run a fake provider in the foreground."""

from __future__ import annotations

from typing import Annotated

import typer

from castad_local.fakes import chat

app = typer.Typer(help="Run a fake network provider on 127.0.0.1.", no_args_is_help=True, add_completion=False)


@app.command("chat")
def run_chat(
    port: Annotated[int, typer.Option(help="port to listen on")] = 8090,
    api_key: Annotated[str, typer.Option(help="the key it accepts")] = chat.DEFAULT_KEY,
) -> None:
    """A fake OpenAI Chat Completions server (base URL http://127.0.0.1:PORT/v1)."""
    fake = chat.FakeChat(port=port, api_key=api_key)
    typer.echo(f"fake Chat Completions on {fake.url}/v1", err=True)
    fake.serve_forever()


@app.callback()
def main() -> None:
    """Fake network providers."""


if __name__ == "__main__":
    app()
