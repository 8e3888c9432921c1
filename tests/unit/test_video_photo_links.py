"""A photo a brief names by URL is fetched, cleaned and kept by the video stage, or fails it.

It is fetched through the guarded client, cleaned as an upload is and kept as the pipeline's file; what is refused,
too large or not an image fails the stage for good, naming the photo, and keeps nothing; a host that is slow or
down is tried again.
"""

from __future__ import annotations

import hashlib
import io
import pathlib
import threading
import time
from collections.abc import Iterator
from http import server

import httpx
import pytest
from castad_contracts import brief, events
from castad_runtime import artifacts
from castad_runtime.artifacts import volume
from castad_runtime.stage import cancellation, errors
from castad_video import photos
from PIL import Image

from tests.unit.test_image_uploads import exif_with_location, photo, png_declaring

PIPELINE = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"
MAX_BYTES = 200_000
# A photo has 3 s to arrive: the fake host on 127.0.0.1 answers at once, but a loaded 2-core host once took over 1 s.
LIMITS = photos.Limits(max_bytes=MAX_BYTES, max_pixels=4_000_000, timeout_s=3.0, allow_private=True)
HALL = photo("JPEG", (64, 32), exif=exif_with_location())


class Host(server.ThreadingHTTPServer):
    """A photo host on 127.0.0.1: each path answers as its name says."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Answer)
        self.hits: list[str] = []

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


class _Answer(server.BaseHTTPRequestHandler):
    server: Host

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.hits.append(self.path)
        bodies = {
            "/hall.jpg": HALL,
            "/notes.txt": b"not a picture at all",
            "/truncated.jpg": HALL[:-200],
            "/bomb.png": png_declaring(20_000, 20_000),
        }
        if self.path in bodies:
            self._send(200, bodies[self.path])
        elif self.path == "/declared-30mb.jpg":  # says it is 30 MB: refused before a byte of it is read
            self.send_response(200)
            self.send_header("content-length", "30000000")
            self.end_headers()
        elif self.path == "/endless.jpg":  # says no size and sends more than the cap
            self.send_response(200)
            self.end_headers()
            for _ in range(MAX_BYTES // 10_000 + 2):
                self.wfile.write(b"\xff" * 10_000)
        elif self.path == "/slow.jpg":
            time.sleep(LIMITS.timeout_s + 0.5)
            self._send(200, HALL)
        elif self.path == "/moved.jpg":
            self.send_response(302)
            self.send_header("location", "/hall.jpg")
            self.send_header("content-length", "0")
            self.end_headers()
        else:
            self._send(int(self.path.strip("/")), b"{}")  # /404, /503: that status

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        pass


@pytest.fixture(scope="module")
def running_host() -> Iterator[Host]:
    served = Host()
    thread = threading.Thread(target=served.serve_forever, daemon=True)
    thread.start()
    yield served
    served.shutdown()
    served.server_close()
    thread.join()


@pytest.fixture
def host(running_host: Host) -> Host:
    running_host.hits.clear()
    return running_host


@pytest.fixture
def store(tmp_path: pathlib.Path) -> volume.VolumeStore:
    return volume.VolumeStore(tmp_path / "artifacts")


def linked(store: artifacts.ArtifactStore, url: str, limits: photos.Limits = LIMITS, index: int = 1, **options):
    return photos.linked_copy(
        store, PIPELINE, index, brief.PhotoLink(url=url), limits, cancellation.Cancellation(), **options
    )


def kept_files(store: volume.VolumeStore) -> list[pathlib.Path]:
    return [path for path in store.root.rglob("*") if path.is_file()]


def test_a_linked_photo_is_fetched_cleaned_and_kept_as_the_pipelines_file_and_a_later_attempt_reuses_it(host, store):
    with linked(store, host.url("/moved.jpg")) as first:
        kept = first.path.read_bytes()

    assert host.hits == ["/moved.jpg", "/hall.jpg"]  # a redirect on the same host is followed
    with Image.open(io.BytesIO(kept)) as read:
        assert read.size == (64, 32) and not read.getexif()  # its location and camera stripped
    [file] = kept_files(store)
    assert file.relative_to(store.root).as_posix().startswith(f"video/{PIPELINE}/video-")
    told = first.photo  # as the completed event tells it: by reference, in the video stage's place
    assert (told.photo, told.url, told.width, told.height) == (1, host.url("/moved.jpg"), 64, 32)
    assert told.file == events.Artifact(
        uri=file.as_uri(), sha256=hashlib.sha256(kept).hexdigest(), size=len(kept), media_type="image/jpeg"
    )
    assert store.serve(told.file, PIPELINE, events.Stage.VIDEO) == file  # the gateway serves it as the stage's
    with linked(store, host.url("/moved.jpg")) as again:
        assert again.path.read_bytes() == kept and again.photo == told
    assert len(host.hits) == 2  # the second attempt fetched nothing
    assert store.delete(PIPELINE, events.Stage.VIDEO) == 1  # retention deletes it with the stage's other files


@pytest.mark.parametrize(
    ("path", "code", "reason"),
    [
        ("/declared-30mb.jpg", "photo_too_large", f"larger than the {MAX_BYTES} bytes accepted"),
        ("/endless.jpg", "photo_too_large", f"larger than the {MAX_BYTES} bytes accepted"),
        ("/bomb.png", "photo_too_large", "more than the 4000000 pixels accepted"),
        ("/notes.txt", "photo_unreadable", "is not a JPEG, PNG or WebP image"),
        ("/truncated.jpg", "photo_unreadable", "truncated or corrupt"),
        ("/404", "photo_unreachable", "its host answered 404"),
    ],
    ids=["declared-30mb", "endless", "pixel-bomb", "not-an-image", "truncated", "not-found"],
)
def test_a_linked_photo_that_cannot_be_shown_fails_for_good_naming_it_and_keeps_nothing(
    host, store, path, code, reason
):
    with pytest.raises(errors.ProviderError) as failed, linked(store, host.url(path)):
        pass

    assert (failed.value.code, failed.value.retryable) == (code, False)
    assert failed.value.message.startswith(f"photos[1] ({host.url(path)})") and reason in failed.value.message
    assert kept_files(store) == []


@pytest.mark.parametrize(("path", "code"), [("/slow.jpg", "photo_timeout"), ("/503", "photo_unreachable")])
def test_a_photo_host_that_is_slow_or_down_is_tried_again(host, store, path, code):
    with pytest.raises(errors.ProviderError) as failed, linked(store, host.url(path)):
        pass

    assert (failed.value.code, failed.value.retryable) == (code, True)
    assert kept_files(store) == []


@pytest.mark.parametrize(
    "where",
    [
        "http://127.0.0.1:{port}/hall.jpg",
        "https://127.0.0.1:{port}/hall.jpg",
        "https://localhost:{port}/hall.jpg",
        "https://169.254.169.254/latest/meta-data/",
        "https://10.0.0.7/hall.jpg",
    ],
)
def test_a_photo_url_of_a_private_address_or_plain_http_is_refused_unless_allowed(host, store, where):
    url = where.format(port=host.server_address[1])
    strict = photos.Limits(max_bytes=MAX_BYTES, max_pixels=4_000_000, timeout_s=1.0, allow_private=False)

    with pytest.raises(errors.ProviderError) as refused, linked(store, url, strict, index=0):
        pass

    assert (refused.value.code, refused.value.retryable) == ("photo_refused", False)
    assert refused.value.message.startswith(f"photos[0] ({url}) is not allowed")
    assert host.hits == [] and kept_files(store) == []


@pytest.mark.parametrize(
    "inside", ["https://169.254.169.254/latest/meta-data/", "https://127.0.0.1/hall.jpg", "http://cdn.example.com/"]
)
def test_a_redirect_from_a_public_host_to_one_inside_or_down_to_http_is_refused(store, inside):
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(302, headers={"location": inside})

    strict = photos.Limits(max_bytes=MAX_BYTES, max_pixels=4_000_000, timeout_s=1.0, allow_private=False)
    with (
        pytest.raises(errors.ProviderError) as refused,
        linked(store, "https://photos.example.com/hall.jpg", strict, transport=httpx.MockTransport(answer)),
    ):
        pass

    assert refused.value.code == "photo_refused" and seen == ["https://photos.example.com/hall.jpg"]
    assert kept_files(store) == []


def test_a_signature_in_a_photo_urls_query_is_not_in_the_error():
    with pytest.raises(errors.ProviderError) as refused:
        photos.fetch(
            0,
            brief.PhotoLink(url="http://photos.example.com/hall.jpg?X-Amz-Signature=abcdef0123456789"),
            photos.Limits(max_bytes=MAX_BYTES, max_pixels=4_000_000, timeout_s=1.0),
            cancellation.Cancellation(),
        )

    assert "abcdef0123456789" not in refused.value.message and refused.value.code == "photo_refused"
