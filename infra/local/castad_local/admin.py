"""`castad-admin`: set up the local stack, run the demo, export schemas, list settings and error codes, serve docs."""

from __future__ import annotations

import os
import pathlib
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Annotated

import typer
from castad_api.commands import keys, tenants, webhook_secrets
from castad_cli import client as client_
from castad_cli import main as cli_main
from castad_cli import progress
from castad_contracts import api, brief, codes, schemas, topology
from castad_runtime import messaging, redact, release, settings
from PIL import Image
from pydantic_settings import BaseSettings
from rich.console import Console

from castad_local import REPO_ROOT, access, charts, demo_photos, privileges, quorum, stack

app = typer.Typer(help="Operate a local Castad.", no_args_is_help=True, add_completion=False)
app.add_typer(keys.app, name="keys")
app.add_typer(webhook_secrets.app, name="webhook-secrets")
app.add_typer(tenants.app, name="tenants")
console = Console()

DEMO_BRIEF = brief.Brief(
    customer_name="스테이 머뭄",
    region="군산",
    detail_region_info="바다가 보이는 조용한 한옥 스테이, 근대 골목 산책",
    language=brief.Language.KOREAN,
    genre="k-pop, bright synth",
    formats=tuple(brief.Format),  # a reel, a feed post and a video for its page, from the one song
    duration_s=20,
)


@app.command()
def setup() -> None:
    """Create and migrate every service database, declare the RabbitMQ topology, and leave an admin API key
    for the `castad` command line in ~/.config/castad/api-key (unless the one there is valid)."""
    for line in stack.prepare():
        console.print(f"[green]✓[/] {line}")
    try:
        env_file = privileges.grant_local({**stack.probe_env(), **stack.link_env()})
    except privileges.PrivilegeError as error:
        console.print(f"[red]{error}", soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(
        f"[green]✓[/] a PostgreSQL role and a RabbitMQ user per service, none a superuser (their URLs, the"
        f" ports of the workers' probes and metrics, and the link keys that seal uploaded photos, in {env_file})",
        soft_wrap=True,
    )
    _, new = access.ensure_local_key()
    state = "made" if new else "kept"
    console.print(f"[green]✓[/] API key of tenant {access.LOCAL_TENANT!r} {state} in {access.LOCAL_KEY_FILE}")


@app.command()
def demo(
    port: Annotated[int, typer.Option(help="gateway port for the demo")] = 8000,
    timeout_s: Annotated[float, typer.Option(help="give up after this long")] = 600.0,
) -> None:
    """Start every service, upload the demo's photos (drawn at run time), run one brief showing them to a
    finished video, stop the services."""
    setup()
    logs = REPO_ROOT / "var" / "log" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    services = stack.Stack({"CASTAD_API_PORT": str(port), **privileges.local_env(), **stack.link_env()}, logs)
    base_url = f"http://127.0.0.1:{port}"
    console.print(f"starting api, relay, lyric, song and video (logs in {logs})", soft_wrap=True)
    services.start_all()
    try:
        services.wait_ready(base_url)
        key, _ = access.ensure_local_key()
        client = client_.Client(base_url, api_key=key)
        uploaded = [client.upload_image(name, data) for name, data in demo_photos.photos().items()]
        for name, image in zip(demo_photos.PHOTOS, uploaded, strict=True):
            console.print(f"uploaded {name}: image {image.id} ({image.width}x{image.height})")
        logo = client.upload_image("logo.png", demo_photos.logo())
        kit = api.BrandKitRequest(logo=logo.id, colors=list(demo_photos.BRAND_COLORS), font="Nanum Square Round")
        client.set_brand(kit)
        console.print(
            f"set the local tenant's brand kit: logo {logo.id}, colours {', '.join(kit.colors)}, font {kit.font}"
            " (castad brand clear removes it)"
        )
        request = api.PipelineRequest(**DEMO_BRIEF.model_dump(), photos=[image.id for image in uploaded])
        accepted = client.submit(request, f"demo-{uuid.uuid4()}")
        console.print(f"submitted {DEMO_BRIEF.customer_name} ({DEMO_BRIEF.region}): pipeline {accepted.id}")
        deadline = time.monotonic() + timeout_s

        def stream() -> Iterator[tuple[str, dict[str, object]]]:
            for item in client.events(accepted.id):
                services.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"demo did not finish within {timeout_s} s")
                yield item

        progress.watch(stream(), console)
        view = client.status(accepted.id)
        if view.status != "SUCCEEDED":
            console.print(f"[red]pipeline {view.status}: {view.error_code}: {view.error_message}")
            raise typer.Exit(1)
        saved = REPO_ROOT / "var" / "demo" / accepted.id
        saved.mkdir(parents=True, exist_ok=True)
        for stage in view.stages:  # fetched through the gateway, as any client would
            assert stage.artifact is not None
            path = saved / f"{stage.stage.value}{cli_main.SUFFIXES.get(stage.artifact.media_type, '')}"
            size = client.download(stage.artifact.download, path)
            console.print(f"{stage.stage.value:>6}: {path} ({size:,} B)", soft_wrap=True)
            extras = [(f"song.{c.format.value}", c.download) for c in stage.captions]
            extras += [("poster.jpg", stage.poster.download)] if stage.poster else []
            for made in stage.formats:
                extras += [(f"video-{made.format.slug}.mp4", made.video.download)]
                extras += [(f"poster-{made.format.slug}.jpg", made.poster.download)] if made.poster else []
            for name, download in extras:
                size = client.download(download, saved / name)
                console.print(f"{'':>6}  {saved / name} ({size:,} B)", soft_wrap=True)
        posters = [saved / f"poster-{shape.slug}.jpg" for shape in DEMO_BRIEF.frames]
        side_by_side(posters, saved / "formats.jpg")
        console.print(f"{'':>6}  {saved / 'formats.jpg'} (the posters of its formats side by side)", soft_wrap=True)
        console.print(f"[bold green]Finished video:[/] {path}", soft_wrap=True)
    finally:
        services.stop_all()
        console.print("services stopped")


def side_by_side(pictures: list[pathlib.Path], out: pathlib.Path, height: int = 480, gap: int = 16) -> None:
    """The pictures in a row, each scaled to `height`, on a dark ground: a JPEG at `out`."""
    shown: list[Image.Image] = []
    for path in pictures:
        with Image.open(path) as opened:
            shown.append(opened.convert("RGB").resize((round(opened.width * height / opened.height), height)))
    row = Image.new("RGB", (sum(p.width for p in shown) + gap * (len(shown) + 1), height + 2 * gap), (24, 24, 32))
    x = gap
    for picture in shown:
        row.paste(picture, (x, gap))
        x += picture.width + gap
    row.save(out, "JPEG", quality=85)


@app.command("schemas")
def export_schemas(directory: pathlib.Path) -> None:
    """Write every event's JSON Schema (and the envelope's and the brief's) into DIRECTORY."""
    for path in schemas.write_schemas(directory):
        console.print(str(path), soft_wrap=True)


def error_codes_table() -> str:
    """Markdown table of every error code a pipeline or an attempt may end with, and its meaning."""
    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| `{code}` | {code.meaning} |" for code in codes.ErrorCode]
    return "\n".join(rows)


def settings_table() -> str:
    """Markdown table of every setting: variable, default, meaning."""
    from castad_api import settings as api_settings
    from castad_lyric import service as lyric
    from castad_relay import settings as relay_settings
    from castad_runtime.stage import service as stage_service
    from castad_song import service as song
    from castad_video import service as video

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    seen: set[str] = set()
    sources: list[tuple[type[BaseSettings], str]] = [
        (settings.CommonSettings, ""),
        (api_settings.ApiSettings, "CASTAD_API_"),
        (relay_settings.RelaySettings, "CASTAD_RELAY_"),
        (stage_service.StageSettings, "CASTAD_<STAGE>_"),
        (lyric.LyricSettings, "CASTAD_LYRIC_"),
        (song.SongSettings, "CASTAD_SONG_"),
        (video.VideoSettings, "CASTAD_VIDEO_"),
    ]
    stage_fields = stage_service.StageSettings.model_fields
    for cls, prefix in sources:
        for name, field in cls.model_fields.items():
            variable = settings.env_var(cls, name, prefix)
            # A stage's own rows: its own settings, and a shared one it describes differently.
            shared = name == "database_url" or (
                name in stage_fields and field.description == stage_fields[name].description
            )
            a_stage = issubclass(cls, stage_service.StageSettings) and cls is not stage_service.StageSettings
            if variable in seen or (a_stage and shared):
                continue
            seen.add(variable)
            default = field.default
            if name == "database_url" and prefix == "CASTAD_<STAGE>_":
                default = settings.database_url_default("<stage>")
            if isinstance(default, tuple):
                default = ",".join(default)
            if isinstance(default, dict):
                default = ",".join(f"{key}={value}" for key, value in default.items())
            shown = "" if default is None else str(default)
            rows.append(f"| `{variable}` | `{shown}` | {field.description or ''} |")
    return "\n".join(rows)


@app.command("charts")
def write_charts() -> None:
    """Rewrite each Helm chart's settings block and values.schema.json from the service's settings."""
    for path in charts.write():
        console.print(str(path.relative_to(REPO_ROOT)), soft_wrap=True)


@app.command("privileges")
def print_privileges(
    namespace: Annotated[str, typer.Option(help="CASTAD_NAMESPACE of the installation")] = "castad",
    vhost: Annotated[str, typer.Option(help="the RabbitMQ vhost")] = "/",
) -> None:
    """Print the PostgreSQL roles and grants and the RabbitMQ users and permissions each service needs."""
    print(privileges.instructions(namespace, vhost))


AdminAmqpUrl = Annotated[
    str,
    typer.Option(
        envvar="CASTAD_AMQP_URL", help="RabbitMQ URL of a user that may configure the whole vhost (an administrator)"
    ),
]
Namespace = Annotated[str, typer.Option(help="CASTAD_NAMESPACE of the installation")]


@app.command("version")
def version() -> None:
    """The release installed here, and each Castad package's; exit 1 if they are not all of one release."""
    installed = release.installed()
    releases = sorted(set(installed.values()))
    console.print(f"Castad {' + '.join(releases) or release.UNKNOWN}")
    for name, number in installed.items():
        console.print(f"  {name} {number}")
    if len(releases) > 1:
        console.print("[red]packages of different releases are installed: sync them (make setup)", soft_wrap=True)
        raise typer.Exit(1)


@app.command("topology")
def declare_topology(
    amqp_url: AdminAmqpUrl,
    namespace: Namespace = "castad",
) -> None:
    """Declare every exchange, queue and binding of the installation, as set-up does locally, and say what type
    each queue is. Run it once with the users, before the services: the relay may only publish, and an event
    published before its consumer's queue exists would be refused as unroutable and, after its retries, parked.
    A queue an earlier version declared as a classic queue is refused: see `move-to-quorum`."""
    topo = topology.Topology(namespace)
    try:
        messaging.declare_topology(amqp_url, topo)
        states = messaging.queue_states(amqp_url, topo)
        interrupted = messaging.interrupted_moves(amqp_url, topo)
    except messaging.TopologyMismatch as error:
        console.print(f"[red]{error}", soft_wrap=True)
        raise typer.Exit(1) from None
    except Exception as error:  # any failure to reach or configure the broker: one line, no traceback
        console.print(f"[red]could not declare the topology: {redact.describe(error)}", soft_wrap=True)
        raise typer.Exit(1) from None
    for state in states:
        console.print(f"  {state.name}: {state.kind}, {state.messages} ready, {state.consumers} consumers")
    for name, messages in interrupted:
        console.print(
            f"[red]{name} holds {messages} messages of an interrupted move: run `castad-admin move-to-quorum` again",
            soft_wrap=True,
        )
    if interrupted:
        raise typer.Exit(1)
    console.print(f"[green]✓[/] exchanges, queues and bindings of namespace {namespace!r} declared", soft_wrap=True)


@app.command("move-to-quorum")
def move_to_quorum(
    amqp_url: AdminAmqpUrl,
    namespace: Namespace = "castad",
) -> None:
    """Move the queues an earlier version declared as classic queues to quorum queues, keeping every message
    waiting in them, in order. Stop every service first, the relay too (docs/deploy.md); run it again if it
    stopped half-way: it goes on from where it was."""
    try:
        done = quorum.move_to_quorum(amqp_url, topology.Topology(namespace))
    except quorum.MoveRefused as error:
        console.print(f"[red]{error}", soft_wrap=True)
        raise typer.Exit(1) from None
    except Exception as error:  # any failure to reach or configure the broker: one line, no traceback
        console.print(f"[red]could not move the queues: {redact.describe(error)}", soft_wrap=True)
        raise typer.Exit(1) from None
    for line in done:
        console.print(f"[green]✓[/] {line}", soft_wrap=True)
    console.print(f"[green]✓[/] every queue of namespace {namespace!r} is a quorum queue", soft_wrap=True)


@app.command("settings")
def print_settings() -> None:
    """Print the table of every setting (docs/operating/settings.md's copy must match it)."""
    print(settings_table())


@app.command("error-codes")
def print_error_codes() -> None:
    """Print the table of every error code (docs/operating/failures.md's copy must match it)."""
    print(error_codes_table())


@app.command("docs")
def serve_docs(
    address: Annotated[str, typer.Option(help="host:port to serve on")] = "127.0.0.1:8010",
) -> None:
    """Serve the docs site (mkdocs serve, rebuilt on every change) until Ctrl-C."""
    os.chdir(REPO_ROOT)
    # Replaced by mkdocs itself, so that Ctrl-C and a stop signal reach the server and nothing is left behind.
    os.execv(sys.executable, [sys.executable, "-m", "mkdocs", "serve", "--strict", "--dev-addr", address])


def main() -> None:
    app()
