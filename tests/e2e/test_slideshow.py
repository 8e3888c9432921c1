"""A brief's uploaded photos in its video.

Each on screen in turn, cut on the song's bar lines, under the captions.
"""

from __future__ import annotations

import pathlib
import uuid

import numpy as np
import pytest
from castad_contracts import brief
from castad_video import provider, slideshow
from PIL import Image, ImageDraw

from tests.unit.test_video_provider import as_shown, decoded

pytestmark = pytest.mark.e2e
FPS = 12
DURATION_S = 6


def three_photos(directory: pathlib.Path) -> list[pathlib.Path]:
    """Three photos easy to tell apart: red and green halves, blue and yellow stripes, a white disc on black."""
    halves = Image.new("RGB", (300, 400), (220, 40, 40))
    halves.paste((40, 200, 60), (150, 0, 300, 400))
    stripes = Image.new("RGB", (400, 300), (40, 60, 220))
    for top in range(0, 300, 60):
        stripes.paste((240, 220, 40), (0, top, 400, top + 30))
    disc = Image.new("RGB", (360, 640), (10, 10, 10))
    ImageDraw.Draw(disc).ellipse((60, 200, 300, 440), fill=(250, 250, 250))
    paths = [directory / name for name in ("halves.png", "stripes.png", "disc.png")]
    for image, path in zip((halves, stripes, disc), paths, strict=True):
        image.save(path)
    return paths


def test_the_video_shows_each_uploaded_photo_in_turn_cut_on_the_songs_bars_under_the_captions(castad, dbs, tmp_path):
    running = castad({"CASTAD_VIDEO_FPS": str(FPS)})
    photos = three_photos(tmp_path)
    ids = []
    for path in photos:
        answer = running.http.post("/v1/images", content=path.read_bytes(), headers={"Content-Type": "image/png"})
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    body = {
        "customer_name": "바다책방",
        "region": "속초",
        "genre": brief.Style.ACOUSTIC.value,  # 96 bpm: bars at 0, 2.5 and 5 s, away from equal thirds of 6 s
        "orientation": brief.Orientation.VERTICAL.value,
        "duration_s": DURATION_S,
        "photos": ids,
    }
    answer = running.http.post("/v1/pipelines", json=body, headers={"Idempotency-Key": str(uuid.uuid4())})
    assert answer.status_code == 202, answer.text
    pipeline_id = answer.json()["id"]

    assert running.wait_terminal([pipeline_id])[pipeline_id].status == "SUCCEEDED"
    [job] = dbs.jobs_of("video", [pipeline_id])
    bars = job["input"]["bars_s"]  # song.completed's, as the video stage got it
    timed = job["input"]["timed_lines"]
    duration = job["input"]["song_duration_s"]
    video = tmp_path / "video.mp4"
    video.write_bytes(running.http.get(f"/v1/pipelines/{pipeline_id}/artifacts/video").content)
    size = provider.frame_size(brief.Format.VERTICAL, 144)
    frames = decoded(video, size)

    assert bars == pytest.approx([0.0, 2.5, 5.0])
    rows = np.r_[int(0.2 * size[1]) : int(0.3 * size[1]), int(0.75 * size[1]) : size[1]]  # off the name and caption
    views = [as_shown(path, size, 0.5)[rows] for path in photos]
    shown = [int(np.argmin([np.mean(np.abs(frame[rows] - view)) for view in views])) for frame in frames]
    for number, frame in enumerate(frames):  # each frame is one photo's, by far
        distances = sorted(float(np.mean(np.abs(frame[rows] - view))) for view in views)
        assert distances[0] < 20 < 35 < distances[1], (number, distances)
    cuts = slideshow.photo_cuts(duration, len(photos), bars)
    expected = [sum(number / FPS >= cut for cut in cuts) for number in range(len(frames))]
    assert shown == expected
    firsts = [shown.index(photo) / FPS for photo in (1, 2)]
    for first in firsts:  # each cut within a frame of a bar line
        assert min(abs(first - bar) for bar in bars) <= 1 / FPS, (first, bars)
    band = slice(int(0.3 * size[1]), int(0.75 * size[1]))
    middles = [(line["start_s"] + line["end_s"]) / 2 for line in timed]
    for time_s in (0.0, *middles):  # the title card, then each sung line's caption, is over the photo then shown
        number = round(time_s * FPS)
        ink = np.mean(np.abs(frames[number][band] - as_shown(photos[shown[number]], size, 0.5)[band]) > 60)
        assert ink > 0.01, (time_s, ink)
