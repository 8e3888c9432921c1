"""`castad brand show | set --color ... [--logo FILE|ID] [--font ...] [--caption-position ...] | clear`."""

from __future__ import annotations

import pathlib
import re
from typing import Annotated

import pydantic
import typer
from castad_contracts import api, brief

from castad_cli.terminal import connected, console, errors

app = typer.Typer(help="The tenant's brand kit, which every brief uses from then on.", no_args_is_help=True)
OWN_FONT = "the language's own"


@app.command()
def show(ctx: typer.Context) -> None:
    """The brand kit as set last (exit 4 if none is set)."""
    with connected(ctx) as client:
        _print(client.brand())


@app.command("set")
def set_(
    ctx: typer.Context,
    color: Annotated[list[str], typer.Option(help="#rrggbb: the main colour, then the accent (repeatable, up to 2)")],
    logo: Annotated[
        str | None, typer.Option(help="an image file (uploaded first) or the id of an image uploaded before")
    ] = None,
    font: Annotated[brief.FontFamily | None, typer.Option(help="the family of the title and captions")] = None,
    caption_position: brief.CaptionPosition = brief.CaptionPosition.MIDDLE,
    caption_size: brief.CaptionSize = brief.CaptionSize.MEDIUM,
) -> None:
    """Set the brand kit; pipelines made before keep the kit they began with."""
    style = {"position": caption_position, "size": caption_size}
    fields: dict[str, object] = {"colors": color, "font": font, "caption_style": style}
    file = _logo_file(logo)
    _kit(fields, None if file else logo)  # checked whole before the logo is uploaded
    with connected(ctx) as client:
        if file is not None:
            try:
                uploaded = client.upload_image(file.name, file.read_bytes())
            except OSError as error:
                errors.print(f"castad: --logo {logo}: {error.strerror or type(error).__name__}", markup=False)
                raise typer.Exit(2) from None
            console.print(f"logo {logo}: {uploaded.id} ({uploaded.media_type}, {uploaded.width}x{uploaded.height})")
            logo = uploaded.id
        _print(client.set_brand(_kit(fields, logo)))


@app.command()
def clear(ctx: typer.Context) -> None:
    """Remove the brand kit: pipelines made from now on have none (exit 4 if none is set)."""
    with connected(ctx) as client:
        client.clear_brand()
    console.print("brand kit removed")


def _logo_file(logo: str | None) -> pathlib.Path | None:
    """The `--logo` file to upload; None for no logo or an image id no file is named after."""
    if logo is None or (re.fullmatch(brief.UUID_PATTERN, logo) and not pathlib.Path(logo).exists()):
        return None
    path = pathlib.Path(logo).expanduser()
    if not path.is_file():
        errors.print(f"castad: --logo {logo}: no such image file", markup=False)
        raise typer.Exit(2)
    return path


def _kit(fields: dict[str, object], logo: str | None) -> api.BrandKitRequest:
    """The kit as the gateway takes it; exit 2 with a line per problem if it is not one."""
    try:
        return api.BrandKitRequest.model_validate({**fields, "logo": logo})
    except pydantic.ValidationError as error:
        for problem in error.errors():
            errors.print(f"castad: {'.'.join(map(str, problem['loc']))}: {problem['msg']}", markup=False)
        raise typer.Exit(2) from None


def _print(kit: api.BrandKit) -> None:
    style = kit.caption_style
    console.print(f"colours: {', '.join(kit.colors)}")
    console.print(f"logo: {kit.logo or 'none'}" + (f" ({kit.logo_download})" if kit.logo_download else ""))
    console.print(f"font: {kit.font or OWN_FONT}")
    console.print(f"captions: {style.position}, {style.size}")
    console.print(f"set: {kit.updated_at:%Y-%m-%d %H:%M:%S %Z}")
