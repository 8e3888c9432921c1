"""What the gateway makes of an uploaded image before it keeps it.

Only a JPEG, PNG or WebP image that decodes whole and is not too large in bytes or in pixels, turned upright, with
none of the upload's metadata.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import struct
import subprocess
import sys
import threading
import time
import zlib

import anyio
import anyio.to_thread
import pytest
from castad_api import creation, decoding
from castad_contracts import api
from castad_runtime import images
from PIL import Image, PngImagePlugin

MAX_BYTES = 2_000_000
MAX_PIXELS = 4_000_000


def photo(fmt: str = "JPEG", size: tuple[int, int] = (64, 32), **options: object) -> bytes:
    """A picture whose left half is red and right half blue, encoded as `fmt` with `options` (metadata)."""
    picture = Image.new("RGB", size, (200, 30, 30))
    picture.paste((30, 30, 200), (size[0] // 2, 0, size[0], size[1]))
    out = io.BytesIO()
    picture.save(out, fmt, **options)
    return out.getvalue()


def clean(data: bytes, declared: str | None = None) -> images.Cleaned:
    return images.clean(data, max_bytes=MAX_BYTES, max_pixels=MAX_PIXELS, declared=declared)


def exif_with_location(orientation: int = 1) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    exif[0x010F] = "PhoneMaker"  # Make
    exif[0x8825] = {1: "N", 2: (35.0, 58.0, 0.0), 3: "E", 4: (126.0, 42.0, 0.0)}  # GPS: Gunsan
    return exif


@pytest.mark.parametrize(("fmt", "media_type"), [("JPEG", "image/jpeg"), ("PNG", "image/png"), ("WEBP", "image/webp")])
def test_a_jpeg_png_or_webp_image_is_kept_in_its_own_format_with_its_size(fmt, media_type):
    kept = clean(photo(fmt), declared=media_type)

    assert (kept.media_type, kept.width, kept.height) == (media_type, 64, 32)
    with Image.open(io.BytesIO(kept.data)) as read:
        assert read.format == fmt and read.size == (64, 32)
        red, blue = read.convert("RGB").getpixel((8, 16)), read.convert("RGB").getpixel((56, 16))
    assert red[0] > 150 > red[2] and blue[2] > 150 > blue[0]


def test_a_photo_is_turned_as_its_exif_orientation_says():
    turned = photo("JPEG", (64, 32), exif=exif_with_location(orientation=6))  # the camera held on its side

    kept = clean(turned)

    assert (kept.width, kept.height) == (32, 64)
    with Image.open(io.BytesIO(kept.data)) as read:
        top, bottom = read.getpixel((16, 8)), read.getpixel((16, 56))
    assert top[0] > 150 and bottom[2] > 150  # rotated a quarter turn clockwise: red (the left) is on top


def test_no_metadata_of_the_upload_is_kept_not_the_location_nor_a_comment_nor_a_colour_profile():
    profile = b"\x00" * 128  # a colour profile's bytes as a file would carry them
    uploads = [
        photo("JPEG", exif=exif_with_location(), comment=b"taken at home", icc_profile=profile),
        photo("WEBP", exif=exif_with_location(), icc_profile=profile),
    ]
    text = PngImagePlugin.PngInfo()
    text.add_text("Comment", "taken at home")
    uploads.append(photo("PNG", pnginfo=text, exif=exif_with_location()))

    for upload in uploads:
        kept = clean(upload)
        with Image.open(io.BytesIO(kept.data)) as read:
            assert not read.getexif() and not read.info.get("icc_profile")
            assert not {"exif", "comment", "Comment", "xmp", "XML:com.adobe.xmp"} & set(read.info)
        assert b"PhoneMaker" not in kept.data and b"taken at home" not in kept.data


def multi_picture_jpeg() -> bytes:
    """A photo as phones write them: a JPEG in the multi-picture format, a green preview after it."""
    preview = Image.new("RGB", (16, 8), (30, 200, 30))
    out = io.BytesIO()
    Image.open(io.BytesIO(photo("JPEG", (64, 32)))).save(out, "MPO", save_all=True, append_images=[preview])
    return out.getvalue()


def test_a_phones_multi_picture_jpeg_is_kept_as_a_jpeg_of_its_photo():
    kept = clean(multi_picture_jpeg(), declared="image/jpeg")

    assert (kept.media_type, kept.width, kept.height) == ("image/jpeg", 64, 32)
    with Image.open(io.BytesIO(kept.data)) as read:
        assert read.format == "JPEG" and getattr(read, "n_frames", 1) == 1
        assert read.getpixel((8, 16))[0] > 150  # the photo's red, not the green preview


# An EXIF block a fuzzer damaged: Pillow's own turning of such a photo raised struct.error, yet its orientation
# (6) reads.
DAMAGED_EXIF = bytes.fromhex(
    "4578696600004d4d002a000000080003010100020000000b0000003201120003000000010006000088250004000000010000003e00"
    "00000050326f6e654d616b65720000000200010002000000024e0000000002da05000000030000005c000000000000002300000001"
    "0000003a00005f010000000000000001"
)


def test_a_photo_with_damaged_exif_is_kept_turned_as_its_orientation_says():
    kept = clean(photo("JPEG", (64, 32), exif=DAMAGED_EXIF))

    assert (kept.width, kept.height) == (32, 64)
    assert DAMAGED_EXIF[6:] not in kept.data


def test_an_upload_whose_decoding_fails_in_any_way_is_refused_and_logged(monkeypatch, caplog):
    def damaged(_: Image.Image) -> Image.Exif:
        raise struct.error("required argument is not an integer")

    monkeypatch.setattr(Image.Image, "getexif", damaged)

    with pytest.raises(images.ImageRefused, match="does not decode"):
        clean(photo("JPEG"))
    [record] = [record for record in caplog.records if record.name == images.__name__]
    assert record.exc_info is not None and isinstance(record.exc_info[1], struct.error)


PEAK_SCRIPT = """
import sys
from castad_runtime import images


def kib(field):  # of this process's memory, from Linux's account of it: its own since its exec, unlike ru_maxrss
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


data = open(sys.argv[1], "rb").read()
before = kib("VmRSS")
images.clean(data, max_bytes=len(data), max_pixels=10**8)
print((kib("VmHWM") - before) * 1024)
"""


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(), reason="reads a process's peak memory from Linux")
@pytest.mark.parametrize("orientation", [1, 6], ids=["upright", "turned"])
def test_cleaning_a_large_photo_holds_at_most_about_two_copies_of_its_pixels(tmp_path, orientation):
    width, height = 4000, 2000  # 32 MB decoded (RGB is 4 bytes a pixel); a phone's photo has 12 to 50 million
    upload = tmp_path / "large.jpg"
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.linear_gradient("L").resize((width, height)).convert("RGB").save(upload, "JPEG", exif=exif)

    ran = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, upload], capture_output=True, text=True, check=True)

    # Once the decoded image, and once a turned copy or the JPEG encoder's buffers (it optimises its tables).
    assert int(ran.stdout) < 2.5 * width * height * 4  # it held 4.7 times as much when it copied them thrice


def png_declaring(width: int, height: int) -> bytes:
    """A valid PNG header that declares `width` x `height` pixels and a few bytes of data: a decompression bomb."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    ("upload", "declared", "reason"),
    [
        (b"", None, "is empty"),
        (b"%PDF-1.7 not a picture at all", None, "is not a JPEG, PNG or WebP image"),
        (photo("GIF"), None, "is not a JPEG, PNG or WebP image"),
        (photo("BMP"), None, "is not a JPEG, PNG or WebP image"),
        (photo("JPEG")[:-200], None, "truncated or corrupt"),
        (photo("PNG")[:-40], None, "truncated or corrupt"),
        (png_declaring(20_000, 20_000), None, "pixels accepted"),
        (png_declaring(2_001, 2_000), None, "2001 x 2000 pixels, more than the 4000000 accepted"),
        (b"\xff" * (MAX_BYTES + 1), None, f"is {MAX_BYTES + 1} bytes, more than the {MAX_BYTES} accepted"),
        (photo("PNG"), "image/jpeg", "is a image/png image, not the image/jpeg it was sent as"),
    ],
    ids=[
        "empty",
        "not-an-image",
        "gif",
        "bmp",
        "truncated-jpeg",
        "truncated-png",
        "bomb",
        "too-many-pixels",
        "too-big",
        "mislabelled",
    ],
)
def test_a_bad_upload_is_refused_with_its_reason(upload, declared, reason):
    with pytest.raises(images.ImageRefused, match=reason):
        clean(upload, declared)


def test_an_animated_image_is_refused():
    frames = [Image.new("RGB", (16, 16), colour) for colour in ("red", "blue")]
    out = io.BytesIO()
    frames[0].save(out, "WEBP", save_all=True, append_images=frames[1:])

    with pytest.raises(images.ImageRefused, match="animated"):
        clean(out.getvalue())


def test_a_request_without_photos_or_formats_hashes_as_before_there_were_any_so_its_idempotency_key_still_matches():
    fields = {"customer_name": "머뭄", "region": "군산"}
    # The request as a release before photos and formats hashed it: every field of the brief, its defaults said.
    before = {**fields, "detail_region_info": "", "language": "Korean", "genre": "pop, ambient", "duration_s": 30}
    digest = hashlib.sha256(
        json.dumps({**before, "orientation": "vertical"}, sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()

    assert creation.request_hash(api.PipelineRequest(**fields)) == digest
    assert creation.request_hash(api.PipelineRequest(**fields, orientation="vertical")) == digest
    with_photo = api.PipelineRequest(**fields, photos=["0d7f3c4e-1a2b-4c3d-8e9f-0a1b2c3d4e5f"])
    assert creation.request_hash(with_photo) != digest
    assert creation.request_hash(api.PipelineRequest(**fields, formats=["9:16", "1:1"])) != digest
    assert creation.request_hash(api.PipelineRequest(**fields, brand="tenant")) == digest  # the default, said
    assert creation.request_hash(api.PipelineRequest(**fields, brand="none")) != digest


def test_a_gateway_process_decodes_one_upload_at_a_time_and_those_waiting_hold_no_worker_thread():
    turns = decoding.Decoding()
    running, most, threads_taken = 0, 0, 0
    lock = threading.Lock()

    def slow_clean() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.1)
        with lock:
            running -= 1

    async def upload() -> None:
        with turns.admitted():
            await turns.run(slow_clean)

    async def uploads() -> None:
        nonlocal threads_taken
        async with anyio.create_task_group() as group:
            for _ in range(decoding.AT_ONCE + decoding.WAITING):
                group.start_soon(upload)
            await anyio.sleep(0.05)
            # The threads FastAPI runs every plain route on: a waiting upload used to hold one.
            threads_taken = anyio.to_thread.current_default_thread_limiter().borrowed_tokens

    anyio.run(uploads)

    assert most == decoding.AT_ONCE == 1 and threads_taken == 0


def test_an_upload_past_those_waiting_for_their_decode_is_refused_until_one_is_done():
    turns = decoding.Decoding(at_once=1, waiting=2)

    with turns.admitted(), turns.admitted():
        with turns.admitted(), pytest.raises(decoding.Busy):
            turns.admitted().__enter__()
        with turns.admitted():  # the third left: its place is free again
            pass
