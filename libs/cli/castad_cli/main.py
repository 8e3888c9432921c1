"""The `castad` command line: submit, watch, show, cancel and retry pipelines.

`castad` submits a brief (uploading its photos), watches it, shows it and its timeline, reviews its draft, cancels or
retries it;
`castad stats` shows the gateway's numbers; `castad dead-letters ...` deals with dead letters.

Every error is one line on stderr and an exit status: 2 the input was refused (also by the
gateway: 400, 413, 415, 422), 3 the gateway cannot be reached, 4 not found (404), 5 a conflict
(409: the pipeline's state does not allow it), 6 the gateway is unavailable (503), 7 the API key
is missing, wrong or lacks the scope (401, 403), 8 too many requests or the tenant's budget reached (429,
402), 1 anything else, and for `watch`/`submit`/`retry --watch` a pipeline that did not succeed.

The API key comes from `--api-key`, CASTAD_API_KEY, or the file CASTAD_API_KEY_FILE (default
~/.config/castad/api-key; `make setup` writes a local one there).
"""

from __future__ import annotations

import datetime as dt
import getpass
import pathlib
import re
import urllib.parse
from typing import Annotated

import pydantic
import typer
from castad_contracts import api, brief, events
from rich.table import Table

from castad_cli import brand, dead_letters, progress, reports, review
from castad_cli import client as client_
from castad_cli.terminal import Options, connected, console, errors

app = typer.Typer(help="Talk to a Castad gateway.", no_args_is_help=True, add_completion=False)
app.add_typer(dead_letters.app, name="dead-letters")
app.add_typer(brand.app, name="brand")
app.command()(review.review)
DEFAULT_GATEWAY = "http://127.0.0.1:8000"
EXIT_BY_STATUS = {None: 3, 400: 2, 401: 7, 403: 7, 404: 4, 402: 8, 409: 5, 413: 2, 415: 2, 422: 2, 429: 8, 503: 6}
DEFAULT_KEY_FILE = pathlib.Path("~/.config/castad/api-key")
SUFFIXES = {"video/mp4": ".mp4", "audio/mpeg": ".mp3", "audio/wav": ".wav", "text/plain; charset=utf-8": ".txt"}


@app.callback()
def _options(
    ctx: typer.Context,
    gateway: Annotated[
        str, typer.Option("--gateway", envvar="CASTAD_GATEWAY_URL", help="base URL of the gateway")
    ] = DEFAULT_GATEWAY,
    actor: Annotated[
        str | None, typer.Option("--actor", envvar="CASTAD_ACTOR", help="who acts (default: your user name)")
    ] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="CASTAD_API_KEY", help="the gateway's API key", show_default=False)
    ] = None,
    api_key_file: Annotated[
        pathlib.Path, typer.Option("--api-key-file", envvar="CASTAD_API_KEY_FILE", help="a file holding the API key")
    ] = DEFAULT_KEY_FILE,
) -> None:
    """Settings come from options or CASTAD_GATEWAY_URL, CASTAD_ACTOR, CASTAD_API_KEY(_FILE)."""
    ctx.obj = Options(gateway, actor or getpass.getuser(), api_key or read_key(api_key_file))


def read_key(path: pathlib.Path) -> str | None:
    """The key in the file, if there is one (a missing key shows as the gateway's 401)."""
    try:
        return path.expanduser().read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


@app.command()
def submit(
    ctx: typer.Context,
    customer_name: Annotated[str, typer.Option(help="business name")],
    region: Annotated[str, typer.Option(help="town or district")],
    detail_region_info: Annotated[str, typer.Option(help="what the place offers")] = "",
    language: brief.Language = brief.Language.KOREAN,
    genre: Annotated[str, typer.Option(help="style tags, free text (e.g. 'acoustic folk')")] = brief.DEFAULT_GENRE,
    orientation: Annotated[
        brief.Orientation | None, typer.Option(help="vertical (9:16) or horizontal (16:9); default: vertical")
    ] = None,
    format_: Annotated[
        list[brief.Format] | None,
        typer.Option(
            "--format", help="a format to make, each from the one song (repeatable; the first is the video's own)"
        ),
    ] = None,
    duration_s: int = brief.DEFAULT_DURATION_S,
    photo: Annotated[
        list[str] | None,
        typer.Option(
            help="a photo to show, in order (repeatable, up to 20): an image file (JPEG, PNG, WebP) uploaded first,"
            " an https URL the video stage fetches, or the id of an image uploaded before"
        ),
    ] = None,
    branded: Annotated[
        bool, typer.Option("--brand/--no-brand", help="the tenant's brand kit (castad brand), or none")
    ] = True,
    review_: Annotated[
        bool, typer.Option("--review", help="approve, edit or regenerate the lyrics (castad review) before the song")
    ] = False,
    review_timeout_s: Annotated[
        int, typer.Option(help="with --review: how long each draft waits for a decision")
    ] = brief.DEFAULT_REVIEW_TIMEOUT_S,
    on_timeout: Annotated[
        str, typer.Option(help="with --review: what an undecided draft comes to, approve or cancel")
    ] = "cancel",
    idempotency_key: Annotated[str | None, typer.Option(help="default: a new random key")] = None,
    watch_: Annotated[bool, typer.Option("--watch/--no-watch", help="follow progress until done")] = True,
) -> None:
    """Submit a brief, uploading its photos first; by default follow it to the end."""
    fields = {
        "customer_name": customer_name,
        "region": region,
        "detail_region_info": detail_region_info,
        "language": language,
        "genre": genre,
        "duration_s": duration_s,
        **({"orientation": orientation} if orientation else {}),
        **({"formats": format_} if format_ else {}),
        **({} if branded else {"brand": "none"}),
        **({"review": {"timeout_s": review_timeout_s, "on_timeout": on_timeout}} if review_ else {}),
    }
    named = photo or []
    files = _photo_files(named)
    # The brief is checked whole before any upload, a file standing for the id its upload will get.
    _request(fields, [f"https://photo.invalid/{urllib.parse.quote(n)}" if n in files else n for n in named])
    with connected(ctx) as client:
        body = _request(fields, [_uploaded(client, name, files[name]) if name in files else name for name in named])
        accepted = client.submit(body, idempotency_key)
        console.print(f"pipeline [bold]{accepted.id}[/] {accepted.status}")
        if watch_:
            raise typer.Exit(_watch(client, accepted.id))


def _request(fields: dict[str, object], photos: list[str]) -> api.PipelineRequest:
    """The brief as the gateway takes it; exit 2 with a line per problem if it is not one."""
    try:
        return api.PipelineRequest.model_validate({**fields, "photos": photos})
    except pydantic.ValidationError as error:
        for problem in error.errors():
            errors.print(f"castad: {'.'.join(map(str, problem['loc']))}: {problem['msg']}")
        raise typer.Exit(2) from None


def _photo_files(named: list[str]) -> dict[str, pathlib.Path]:
    """Each `--photo` that is a file.

    Exit 2 before anything is uploaded if one cannot be read. An https URL, or an image id no file is named after,
    is not a file: the gateway is given it as it is.
    """
    files: dict[str, pathlib.Path] = {}
    for name in named:
        path = pathlib.Path(name).expanduser()
        if "://" in name or (re.fullmatch(brief.UUID_PATTERN, name) and not path.exists()):
            continue
        _read(name, path, 1)
        files[name] = path
    return files


def _read(name: str, path: pathlib.Path, size: int = -1) -> bytes:
    """The file's first `size` bytes (-1: all); exit 2 naming it if it cannot be read."""
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a folder, not an image file")
        with path.open("rb") as read:
            return read.read(size)
    except OSError as error:
        errors.print(f"castad: --photo {name}: {error.strerror or type(error).__name__}", markup=False)
        raise typer.Exit(2) from None


def _uploaded(client: client_.Client, name: str, path: pathlib.Path) -> str:
    """The id the gateway gave the uploaded file; its refusal names the file."""
    try:
        image = client.upload_image(path.name, _read(name, path))
    except client_.GatewayError as error:
        raise client_.GatewayError(f"--photo {name}: {error}", error.status) from None
    console.print(f"photo {name}: {image.id} ({image.media_type}, {image.width}x{image.height})", markup=False)
    return image.id


@app.command()
def watch(ctx: typer.Context, pipeline_id: str) -> None:
    """Live progress bars of a pipeline until it ends; exit status 1 if it did not succeed."""
    with connected(ctx) as client:
        raise typer.Exit(_watch(client, pipeline_id))


@app.command()
def status(ctx: typer.Context, pipeline_id: str) -> None:
    """Status, attempts, errors and artifacts of a pipeline."""
    with connected(ctx) as client:
        view = client.status(pipeline_id)
    title = f"{view.id}: {view.status} ({view.progress}%)"
    if view.retries:
        title += f", retried {view.retries}×"
    table = Table(title=title)
    for column in ("stage", "status", "attempts", "last error", "artifact"):
        table.add_column(column)
    for stage in view.stages:
        error = f"{stage.last_error_code}: {stage.last_error_message}" if stage.last_error_code else ""
        artifact = f"{stage.artifact.download} ({stage.artifact.size:,} B)" if stage.artifact else ""
        table.add_row(stage.stage.value, stage.status, str(stage.attempts), error, artifact)
    console.print(table)


@app.command()
def timeline(ctx: typer.Context, pipeline_id: str) -> None:
    """Everything that happened to a pipeline, in order; every attempt with its worker and duration."""
    with connected(ctx) as client:
        shown = client.timeline(pipeline_id)
    console.print(reports.timeline(shown))


@app.command()
def stats(
    ctx: typer.Context,
    window: Annotated[str, typer.Option(help="how far back: 15m, 1h, 24h, 7d or seconds")] = "1h",
) -> None:
    """The gateway's numbers.

    Pipelines in flight and ended, each stage's queue, failures and durations, stuck attempts, dead letters (an
    admin key).
    """
    with connected(ctx) as client:
        numbers = client.stats(window)
    console.print(reports.stats(numbers))


@app.command()
def usage(
    ctx: typer.Context,
    first: Annotated[
        dt.datetime | None,
        typer.Option("--from", formats=["%Y-%m-%d"], help="the first UTC day (default: this month's)"),
    ] = None,
    last: Annotated[
        dt.datetime | None, typer.Option("--to", formats=["%Y-%m-%d"], help="the last UTC day (default: today)")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="an admin key: whose (default: every tenant's)")] = None,
) -> None:
    """What the key's tenant used per day: pipelines, provider calls, seconds made, bytes kept, estimated cost.

    With its budgets and what it used of them, and its weight in the stages' fair turns.
    """
    with connected(ctx) as client:
        used = client.usage(first and first.date(), last and last.date(), tenant)
    console.print(reports.usage(used))


@app.command()
def download(
    ctx: typer.Context,
    pipeline_id: str,
    stage: Annotated[events.Stage, typer.Option(help="whose file")] = events.Stage.VIDEO,
    captions: Annotated[
        api.CaptionFormat | None,
        typer.Option(help="the song's sung lines as a caption file instead (srt: SubRip, vtt: WebVTT)"),
    ] = None,
    poster: Annotated[bool, typer.Option("--poster", help="the video's poster (a JPEG still) instead")] = False,
    format_: Annotated[
        brief.Format | None,
        typer.Option("--format", help="the video (or with --poster its poster) in this format of the brief's"),
    ] = None,
    output: Annotated[
        pathlib.Path | None, typer.Option(help="default: <pipeline id>-<stage> in this directory")
    ] = None,
) -> None:
    """Save a stage's file (the finished video by default), the song's caption file or the video's poster."""
    if captions and (poster or format_) or (captions or poster or format_) and stage is not events.Stage.VIDEO:
        errors.print("castad: --captions, --poster or --format, and --stage each name a file: give one of them")
        raise typer.Exit(2)
    whose = events.Stage.SONG if captions else events.Stage.VIDEO if poster else stage
    with connected(ctx) as client:
        made = next(s for s in client.status(pipeline_id).stages if s.stage is whose)
        if made.artifact is None:
            errors.print(f"castad: {made.stage.value} of {pipeline_id} has no file yet")
            raise typer.Exit(4)
        if format_ is not None:
            path, suffix = _format_file(made, pipeline_id, format_, poster)
        elif poster:
            if made.poster is None:
                errors.print(f"castad: the video of {pipeline_id} has no poster (its renderer made none)")
                raise typer.Exit(4)
            path, suffix = made.poster.download, "-poster.jpg"
        elif captions is None:
            path, suffix = made.artifact.download, SUFFIXES.get(made.artifact.media_type, "")
        else:
            found = next((link for link in made.captions if link.format is captions), None)
            if found is None:
                errors.print(f"castad: the song of {pipeline_id} has no caption files (made by an earlier release)")
                raise typer.Exit(4)
            path, suffix = found.download, f".{captions.value}"
        dest = output or pathlib.Path(f"{pipeline_id}-{made.stage.value}{suffix}")
        size = client.download(path, dest)
    console.print(f"{dest} ({size:,} B)", soft_wrap=True)


def _format_file(made: api.StageView, pipeline_id: str, shape: brief.Format, poster: bool) -> tuple[str, str]:
    """The gateway's path of the video (or its poster) in `shape`, and the saved file's suffix; exit 4 if none."""
    found = next((link for link in made.formats if link.format is shape), None)
    if found is None:
        asked = ", ".join(link.format for link in made.formats) or "one format, listed by a release before formats"
        errors.print(f"castad: the video of {pipeline_id} has no {shape} format (made: {asked})")
        raise typer.Exit(4)
    if not poster:
        return found.video.download, f"-{shape.slug}.mp4"
    if found.poster is None:
        errors.print(f"castad: the {shape} video of {pipeline_id} has no poster (its renderer made none)")
        raise typer.Exit(4)
    return found.poster.download, f"-{shape.slug}-poster.jpg"


@app.command()
def remake(
    ctx: typer.Context,
    pipeline_id: str,
    from_: Annotated[
        str, typer.Option("--from", help="the first stage made again: song (same lyrics) or video (same song)")
    ],
    genre: Annotated[str | None, typer.Option(help="the song's genre (--from song)")] = None,
    orientation: Annotated[brief.Orientation | None, typer.Option(help="the video's orientation")] = None,
    format_: Annotated[
        list[brief.Format] | None, typer.Option("--format", help="a format to make (repeatable)")
    ] = None,
    photo: Annotated[
        list[str] | None, typer.Option(help="a photo to show instead: an uploaded image's id or an https URL")
    ] = None,
    brand_: Annotated[str | None, typer.Option("--brand", help="tenant (the kit as it is now) or none")] = None,
    watch_: Annotated[bool, typer.Option("--watch/--no-watch", help="follow progress until done")] = True,
) -> None:
    """Make an ended pipeline again from one stage on, with changes; the stages before reuse their files."""
    changes = {
        name: value
        for name, value in (
            ("genre", genre),
            ("orientation", orientation),
            ("formats", format_),
            ("photos", photo),
            ("brand", brand_),
        )
        if value is not None
    }
    try:
        body = api.RemakeRequest.model_validate({"from": from_, "changes": changes})
    except pydantic.ValidationError as error:
        for problem in error.errors():
            errors.print(f"castad: {'.'.join(map(str, problem['loc']))}: {problem['msg']}", markup=False)
        raise typer.Exit(2) from None
    with connected(ctx) as client:
        accepted = client.remake(pipeline_id, body)
        console.print(f"pipeline [bold]{accepted.id}[/] {accepted.status} (a remake of {pipeline_id} from {from_})")
        if watch_:
            raise typer.Exit(_watch(client, accepted.id))


@app.command()
def cancel(
    ctx: typer.Context,
    pipeline_id: str,
    reason: Annotated[str | None, typer.Option(help="why (shown in its status and timeline)")] = None,
) -> None:
    """Cancel a pipeline that has not ended (exit 5 if it had ended SUCCEEDED or FAILED)."""
    with connected(ctx) as client:
        done = client.cancel(pipeline_id, reason)
    asked = f"cancel #{done.operation} requested" if done.operation else "cancel had been requested already"
    console.print(f"pipeline {done.id}: {done.status} ({asked})")


@app.command()
def retry(
    ctx: typer.Context,
    pipeline_id: str,
    max_attempts: Annotated[
        list[str] | None, typer.Option(help="STAGE=N, the attempt budget of a stage for this retry (repeatable)")
    ] = None,
    watch_: Annotated[bool, typer.Option("--watch/--no-watch", help="follow progress until done")] = False,
) -> None:
    """Resume a FAILED or CANCELED pipeline where it stopped (exit 5 if it is neither)."""
    budgets = _budgets(max_attempts or [])
    with connected(ctx) as client:
        done = client.retry(pipeline_id, budgets)
        stage = done.resumes_at.value if done.resumes_at else "?"
        console.print(f"pipeline {done.id}: {done.status} again from {stage} (retry #{done.operation})")
        if watch_:
            raise typer.Exit(_watch(client, pipeline_id))


def _budgets(values: list[str]) -> dict[events.Stage, int] | None:
    budgets: dict[events.Stage, int] = {}
    for value in values:
        stage, _, number = value.partition("=")
        try:
            budgets[events.Stage(stage.strip())] = int(number)
        except ValueError:
            stages = ", ".join(stage.value for stage in events.Stage)
            errors.print(f"castad: --max-attempts {value!r}: expected STAGE=N with STAGE one of {stages}")
            raise typer.Exit(2) from None
    return budgets or None


def _watch(client: client_.Client, pipeline_id: str) -> int:
    last = progress.watch(client.events(pipeline_id), console)
    final = client.status(pipeline_id)
    if final.status == "SUCCEEDED":
        video = next(s.artifact for s in final.stages if s.stage.value == "video")
        assert video is not None
        console.print(f"[green]done[/]: {client.base_url}{video.download}", soft_wrap=True)
        return 0
    console.print(f"[red]{final.status}[/]: {final.error_code}: {final.error_message} ({last.get('step')})")
    return 1


def main() -> None:
    try:
        app()
    except client_.GatewayError as error:
        errors.print(f"castad: {error}", markup=False, highlight=False)
        raise SystemExit(EXIT_BY_STATUS.get(error.status, 1)) from None
