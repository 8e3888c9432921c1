"""`castad submit --photo` (and `--format`), and `castad brand`, against the gateway's HTTP API.

Each file uploaded, then the brief submitted naming the uploads and the URLs in the order given; a file that cannot
be read or an image the gateway refuses is one line and exit 2, and nothing is submitted. The formats asked for, in
order; an orientation that disagrees with them is one line and exit 2.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import sqlalchemy as sa
from castad_api import keys, tables
from castad_cli import main
from castad_runtime import artifacts

from tests.e2e.test_cli import one_line_error
from tests.integration.gateway import make_key
from tests.unit.test_image_uploads import photo

pytestmark = pytest.mark.integration
BRIEF = ("submit", "--customer-name", "Stay Meomum", "--region", "Gunsan", "--no-watch")
TERRACE = "https://photos.example.com/terrace.jpg"


@pytest.fixture
def cli(monkeypatch, capsys):
    """`castad` run in this process, as its entry point runs it.

    Errors and exit statuses come alike; this spares each call the second or more a new interpreter takes to import
    it.
    """

    def run(gateway: str, *args: str, key: str = "") -> subprocess.CompletedProcess[str]:
        monkeypatch.setenv("CASTAD_API_KEY", key)
        monkeypatch.setenv("CASTAD_API_KEY_FILE", "/nonexistent")
        monkeypatch.setattr(sys, "argv", ["castad", "--gateway", gateway, "--actor", "cli-test", *args])
        with pytest.raises(SystemExit) as ended:
            main.main()
        said = capsys.readouterr()
        return subprocess.CompletedProcess(sys.argv, ended.value.code or 0, said.out, said.err)

    return run


def count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()


def test_submit_uploads_each_photo_then_names_them_and_the_urls_in_order_and_a_bad_one_submits_nothing(
    engines, api, tmp_path, cli
):
    running = api()
    key = make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ)
    hall, garden, menu = tmp_path / "hall.jpg", tmp_path / "garden.png", tmp_path / "menu.pdf"
    hall.write_bytes(photo("JPEG", (64, 32)))
    garden.write_bytes(photo("PNG", (40, 40)))
    menu.write_bytes(b"%PDF-1.7 a menu")
    missing = tmp_path / "nowhere.jpg"

    one_line_error(
        cli(running.base_url, *BRIEF, "--photo", str(hall), "--photo", str(missing), key=key),
        2,
        f"--photo {missing}: No such file or directory",
    )
    one_line_error(cli(running.base_url, *BRIEF, "--photo", str(tmp_path), key=key), 2, "is a folder")
    one_line_error(cli(running.base_url, *BRIEF, "--photo", "ftp://photos.example.com/a.jpg", key=key), 2, "photos.0")
    assert count(engines["api"], tables.images) == 0  # all checked before anything was uploaded
    refused = cli(running.base_url, *BRIEF, "--photo", str(hall), "--photo", str(menu), key=key)
    one_line_error(refused, 2, f"--photo {menu}: 422: body.file: the image is not a JPEG, PNG or WebP image")
    reader = make_key(engines["api"], "hana", keys.Scope.READ)
    one_line_error(cli(running.base_url, *BRIEF, "--photo", str(hall), key=reader), 7, f"--photo {hall}: 403")
    assert count(engines["api"], tables.pipelines) == 0

    done = cli(running.base_url, *BRIEF, "--photo", str(hall), "--photo", TERRACE, "--photo", str(garden), key=key)

    assert done.returncode == 0, done.stdout + done.stderr
    uploads, (accepted,) = done.stdout.splitlines()[:2], done.stdout.splitlines()[2:]
    assert "(image/jpeg, 64x32)" in uploads[0] and "(image/png, 40x40)" in uploads[1]
    shown = running.client(key).get(f"/v1/pipelines/{accepted.split()[1]}").json()["brief"]["photos"]
    assert [p.get("media_type") for p in shown] == ["image/jpeg", None, "image/png"]
    assert shown[1] == {"url": TERRACE}  # in the order given, the URL as it is
    assert [p["id"] for p in (shown[0], shown[2])] == [line.split()[2] for line in uploads]
    assert shown[0]["owner"] == shown[2]["owner"] == artifacts.image_owner("hana")


def test_photos_with_the_gateway_down_are_exit_3_after_the_files_were_found(tmp_path, cli):
    good = tmp_path / "hall.jpg"
    good.write_bytes(photo())
    down = "http://127.0.0.1:9"  # the discard port: nothing listens there
    one_line_error(cli(down, *BRIEF, "--photo", str(good)), 3, "cannot reach the gateway")
    one_line_error(cli(down, *BRIEF, "--photo", str(tmp_path / "gone.jpg")), 2, "No such file or directory")


def test_submit_asks_for_the_formats_given_in_order_and_refuses_an_orientation_that_disagrees(engines, api, cli):
    running = api()
    key = make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ)
    one_line_error(
        cli(running.base_url, *BRIEF, "--format", "16:9", "--orientation", "vertical", key=key),
        2,
        "formats: Value error, begin with 16:9, which is horizontal, but orientation is vertical",
    )
    one_line_error(cli(running.base_url, *BRIEF, "--format", "1:1", "--format", "1:1", key=key), 2, "more than once")
    assert count(engines["api"], tables.pipelines) == 0

    done = cli(running.base_url, *BRIEF, "--format", "1:1", "--format", "9:16", key=key)

    assert done.returncode == 0, done.stdout + done.stderr
    shown = running.client(key).get(f"/v1/pipelines/{done.stdout.split()[1]}").json()["brief"]
    assert (shown["formats"], shown["orientation"]) == (["1:1", "9:16"], "vertical")
    wide = cli(running.base_url, *BRIEF, "--orientation", "horizontal", key=key)  # as before formats
    assert running.client(key).get(f"/v1/pipelines/{wide.stdout.split()[1]}").json()["brief"]["orientation"] == (
        "horizontal"
    )


def test_brand_sets_the_kit_uploading_its_logo_shows_it_and_clears_it_each_error_one_line(engines, api, tmp_path, cli):
    running = api()
    key = make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ)
    logo = tmp_path / "logo.png"
    logo.write_bytes(photo("PNG", (40, 40)))
    one_line_error(cli(running.base_url, "brand", "show", key=key), 4, "404: this tenant has set no brand kit")
    one_line_error(cli(running.base_url, "brand", "set", "--color", "#fff", key=key), 2, "colors.0: String should")
    one_line_error(
        cli(running.base_url, "brand", "set", "--color", "#000000", "--logo", str(tmp_path / "gone.png"), key=key),
        2,
        "no such image file",
    )
    assert count(engines["api"], tables.images) == 0  # nothing uploaded for a kit refused

    done = cli(
        running.base_url, "brand", "set", "--color", "#0B3D91", "--color", "#ffc20e", "--logo", str(logo),
        "--font", "Noto Sans CJK", "--caption-position", "bottom", key=key,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    assert said[0].startswith(f"logo {logo}: ") and "colours: #0b3d91, #ffc20e" in said
    kit = running.client(key).get("/v1/brand").json()
    assert (kit["font"], kit["caption_style"]["position"], kit["logo"]) == (
        "Noto Sans CJK",
        "bottom",
        said[0].split()[2],
    )
    assert cli(running.base_url, "brand", "show", key=key).stdout.splitlines() == said[1:]
    plain = cli(running.base_url, *BRIEF, "--no-brand", key=key)  # a brief may ask for no kit
    assert "brand" not in running.client(key).get(f"/v1/pipelines/{plain.stdout.split()[1]}").json()["brief"]
    branded = cli(running.base_url, *BRIEF, key=key)
    assert running.client(key).get(f"/v1/pipelines/{branded.stdout.split()[1]}").json()["brief"]["brand"]["logo"]
    assert cli(running.base_url, "brand", "clear", key=key).stdout.strip() == "brand kit removed"
    one_line_error(cli(running.base_url, "brand", "clear", key=key), 4, "404: this tenant has set no brand kit")
