"""One brief through every service.

Lyrics, a song and a video, all downloadable; and one with photos, one uploaded to the gateway and one named by URL
that the video stage fetches from a local photo host, both shown in its video, the one fetched by URL listed and
downloadable with the pipeline's files, and the video's poster showing the first.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pathlib
import threading
import uuid
from collections.abc import Iterator
from http import server

import numpy as np
import pytest
from castad_contracts import topology
from castad_testkit import briefs
from PIL import Image

from tests.e2e.conftest import RunningCastad
from tests.unit.test_video_provider import frame_at

pytestmark = pytest.mark.e2e
RED, BLUE = (220, 40, 40), (40, 60, 220)


@pytest.fixture
def photo_host(tmp_path: pathlib.Path) -> Iterator[str]:
    """A plain http server on 127.0.0.1 serving the test's folder."""
    handler = functools.partial(server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    served = server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=served.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{served.server_address[1]}"
    served.shutdown()
    served.server_close()
    thread.join()


def picture(colour: tuple[int, int, int], size: tuple[int, int]) -> Image.Image:
    """A photo mostly of `colour`, with white bars: something for a crop to keep."""
    drawn = Image.new("RGB", size, colour)
    for left in range(0, size[0], size[0] // 4):
        drawn.paste((240, 240, 240), (left, 0, left + size[0] // 16, size[1]))
    return drawn


def redness(frame: Image.Image) -> float:
    """How much redder than blue a frame is on average: positive over the red photo, negative over the blue."""
    pixels = np.asarray(frame, dtype=np.float64)
    return float(pixels[..., 0].mean() - pixels[..., 2].mean())


def submit_with_photos(running: RunningCastad, photo_host: str, folder: pathlib.Path) -> str:
    """A brief showing a red photo uploaded first, then a blue one by the photo host's URL."""
    out = io.BytesIO()
    picture(RED, (320, 240)).save(out, "JPEG")
    uploaded = running.http.post("/v1/images", content=out.getvalue(), headers={"Content-Type": "image/jpeg"})
    assert uploaded.status_code == 201, uploaded.text
    picture(BLUE, (240, 320)).save(folder / "hall.png")
    body = {
        **briefs.sample(duration_s=6).model_dump(mode="json"),
        "photos": [uploaded.json()["id"], f"{photo_host}/hall.png"],
    }
    accepted = running.http.post("/v1/pipelines", json=body, headers={"Idempotency-Key": str(uuid.uuid4())})
    assert accepted.status_code == 202, accepted.text
    return str(accepted.json()["id"])


def test_a_brief_becomes_lyrics_a_song_and_a_video_and_one_with_photos_shows_them(shared, photo_host, tmp_path):
    running = shared  # whose settings allow the photo host
    pipeline_id = running.submit()
    with_photos = submit_with_photos(running, photo_host, tmp_path)

    views = running.wait_terminal([pipeline_id, with_photos])

    view = views[pipeline_id]
    assert view.status == "SUCCEEDED"
    assert [stage.stage.value for stage in view.stages] == list(topology.STAGES)
    for stage in view.stages:
        assert stage.status == "SUCCEEDED"
        assert stage.artifact is not None
        download = running.http.get(f"/v1/pipelines/{pipeline_id}/artifacts/{stage.stage.value}")
        assert download.status_code == 200
        assert hashlib.sha256(download.content).hexdigest() == stage.artifact.sha256
        assert len(download.content) == stage.artifact.size
        suffix = {"lyric": ".txt", "song": ".wav", "video": ".mp4"}[stage.stage.value]
        disposition = download.headers["content-disposition"]
        assert disposition.endswith(f'filename="{pipeline_id}-{stage.stage.value}{suffix}"'), disposition
    photos = views[with_photos]
    assert photos.status == "SUCCEEDED", [(stage.stage, stage.last_error_message) for stage in photos.stages]
    video = tmp_path / "video.mp4"
    video.write_bytes(running.http.get(f"/v1/pipelines/{with_photos}/artifacts/video").content)
    shown = [redness(frame_at(video, at, tmp_path / f"at-{at}.png")) for at in (0.5, 1.5, 2.5, 3.5, 4.5, 5.5)]
    assert max(shown) > 40 and min(shown) < -40, shown  # the red upload and the blue photo fetched by URL
    assert shown.index(max(shown)) < shown.index(min(shown)), shown  # in the brief's order
    # Its poster: a still of the title card over the first photo, the red one, at the video's size.
    poster = photos.stages[2].poster
    assert poster is not None and poster.media_type == "image/jpeg"
    still = running.http.get(poster.download)
    assert still.status_code == 200 and hashlib.sha256(still.content).hexdigest() == poster.sha256
    with Image.open(io.BytesIO(still.content)) as opened:
        assert opened.size == (144, 256) and redness(opened.convert("RGB")) > 40
    # The photo fetched by URL is a file of the pipeline's video stage: listed with it and downloadable there.
    [fetched] = photos.stages[2].fetched_photos
    assert (fetched.photo, fetched.url, fetched.media_type) == (1, f"{photo_host}/hall.png", "image/png")
    assert (fetched.width, fetched.height) == (240, 320)
    kept = running.http.get(fetched.download)
    assert kept.status_code == 200 and len(kept.content) == fetched.size
    assert hashlib.sha256(kept.content).hexdigest() == fetched.sha256
    with Image.open(io.BytesIO(kept.content)) as opened:
        assert opened.size == (240, 320) and redness(opened.convert("RGB")) < -40  # the blue photo, as cleaned
