"""The demo's photos: drawn the same at every run, each an image the gateway keeps, each unlike the others."""

from __future__ import annotations

import io

from castad_local import demo_photos
from castad_runtime import images
from PIL import Image, ImageStat


def test_the_demo_photos_are_the_same_bytes_every_run_and_images_the_gateway_keeps():
    drawn = demo_photos.photos()

    assert drawn == demo_photos.photos()
    assert list(drawn) == ["sea-at-dusk.jpg", "hanok-roof.jpg", "room-by-the-sea.jpg"]
    for data in drawn.values():
        kept = images.clean(data, max_bytes=1_000_000, max_pixels=10_000_000, declared="image/jpeg")
        assert (kept.media_type, kept.width, kept.height) == ("image/jpeg", *demo_photos.SIZE)


def test_no_two_demo_photos_look_alike():
    """No two demo photos look alike.

    Their tiny greyscale thumbnails differ by a good part of the range in most places (a slideshow's frames must be
    told apart by the pictures they show).
    """
    thumbs = [Image.open(io.BytesIO(data)).convert("L").resize((16, 12)) for data in demo_photos.photos().values()]
    for i, a in enumerate(thumbs):
        for b in thumbs[i + 1 :]:
            difference = [abs(p - q) for p, q in zip(a.tobytes(), b.tobytes(), strict=True)]
            assert sum(d > 25 for d in difference) > len(difference) // 3
    assert len({tuple(round(v) for v in ImageStat.Stat(t).mean) for t in thumbs}) == 3
