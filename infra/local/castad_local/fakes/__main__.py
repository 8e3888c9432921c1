"""`python -m castad_local.fakes chat|suno|creatomate --port N`: run a fake provider in the foreground."""

from __future__ import annotations

from typing import Annotated

import typer

from castad_local.fakes import chat, creatomate, suno

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


@app.command("suno")
def run_suno(
    port: Annotated[int, typer.Option(help="port to listen on")] = 8091,
    api_key: Annotated[str, typer.Option(help="the key it accepts")] = suno.DEFAULT_KEY,
    song_s: Annotated[float, typer.Option(help="seconds a task takes to finish")] = 30.0,
    audio_s: Annotated[float, typer.Option(help="seconds of the MP3 each track serves")] = 6.0,
    listed_after_s: Annotated[float, typer.Option(help="seconds a task is 'not found' after its submit")] = 0.0,
) -> None:
    """A fake sunoapi.org Suno API server (base URL http://127.0.0.1:PORT)."""
    fake = suno.FakeSuno(port=port, api_key=api_key, song_s=song_s, audio_s=audio_s, listed_after_s=listed_after_s)
    typer.echo(f"fake Suno API on {fake.url}", err=True)
    fake.serve_forever()


@app.command("creatomate")
def run_creatomate(
    port: Annotated[int, typer.Option(help="port to listen on")] = 8092,
    api_key: Annotated[str, typer.Option(help="the key it accepts")] = creatomate.DEFAULT_KEY,
    render_s: Annotated[float, typer.Option(help="seconds a render takes to finish")] = 5.0,
) -> None:
    """A fake Creatomate API server (base URL http://127.0.0.1:PORT, renders under /v2/renders)."""
    fake = creatomate.FakeCreatomate(port=port, api_key=api_key, render_s=render_s)
    typer.echo(f"fake Creatomate API on {fake.url}", err=True)
    fake.serve_forever()


@app.callback()
def main() -> None:
    """Fake network providers."""


if __name__ == "__main__":
    app()
