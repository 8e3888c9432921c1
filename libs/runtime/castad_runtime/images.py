"""A stranger's image made safe to keep: decoded, checked, turned upright, re-encoded without its metadata.

The gateway cleans an upload with it, the video stage a photo it fetched from a brief's URL: the same
checks for both. Only what decodes as a JPEG, PNG or WebP image is kept, and only after it decoded whole: its
dimensions are read from its header and refused past a pixel limit before any pixel is decoded (a
small file can declare a huge image: a decompression bomb). The image is turned as its EXIF
orientation says, then encoded again from its pixels alone, so that nothing of the original's
metadata (EXIF with its camera and location, XMP, comments, colour profiles, text chunks) is kept.
A phone's JPEG in the multi-picture format (an MPO: the photo and a preview or depth map after it)
is a JPEG: its first picture, the photo, is kept.

The bytes are a stranger's: whatever decoding them raises (a damaged EXIF block can make Pillow
raise errors no file format documents) refuses the image, logged, rather than failing the request or the
stage.

Memory: a decoded image takes 4 bytes a pixel (RGB is padded), 160 MB at 40 million pixels. An upright
RGB image is encoded from the decoded image itself; a turned or converted one from a copy, the image it
was made from closed as soon as the copy is made. At most about twice the decoded image is held at
once: it and a copy, or it and the JPEG encoder's buffers (optimised tables need every coefficient).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import typing
import warnings

from castad_contracts import brief
from PIL import ExifTags, Image, UnidentifiedImageError

log = logging.getLogger(__name__)

# The media types accepted: the brief's own list, the one place that says which.
MEDIA_TYPES: tuple[str, ...] = typing.get_args(brief.ImageMediaType)
# Formats Pillow names that are one of those: a JPEG in the multi-picture format (phones write them).
SAME_AS = {"MPO": "JPEG"}
JPEG_QUALITY = 90
# An EXIF orientation -> what turns the image upright (1, or a value no camera writes: nothing).
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


class ImageRefused(Exception):
    """The bytes are not an image kept here; the message says why."""


class TooLarge(ImageRefused):
    """The image has more bytes or more pixels than are accepted."""


@dataclasses.dataclass(frozen=True)
class Cleaned:
    data: bytes
    media_type: str
    width: int
    height: int


@functools.cache
def formats() -> dict[str, str]:
    """Pillow's name of each format accepted -> its media type, as Pillow's own table says (its plugins loaded)."""
    Image.init()
    return {name: media_type for name, media_type in Image.MIME.items() if media_type in MEDIA_TYPES}


def clean(data: bytes, *, max_bytes: int, max_pixels: int, declared: str | None = None) -> Cleaned:
    """The image in `data`, upright and without metadata, in the format it came in.

    Raises ImageRefused for empty or too many bytes, anything but a JPEG, PNG or WebP image
    (or not the one `declared`, a media type), an animated one, one of more than `max_pixels`
    pixels, and one that does not decode whole (truncated or corrupt, or raising anything else).
    """
    if not data:
        raise ImageRefused("is empty")
    if len(data) > max_bytes:
        raise TooLarge(f"is {len(data)} bytes, more than the {max_bytes} accepted")
    try:
        with warnings.catch_warnings():
            # Pillow warns of an image past its own limit and refuses one twice that; the limit here is checked
            # below, before any pixel is decoded, whatever Pillow's is.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=list(formats()))
        with opened:
            return _cleaned(opened, max_pixels, declared)
    except (ImageRefused, MemoryError):
        raise  # a refusal already, or this process's shortage: nothing the image says
    except Image.DecompressionBombError:
        raise TooLarge(f"has more than the {max_pixels} pixels accepted") from None
    except UnidentifiedImageError:
        raise ImageRefused("is not a JPEG, PNG or WebP image") from None
    except (OSError, SyntaxError, ValueError, EOFError):
        raise ImageRefused("does not decode: it is truncated or corrupt") from None
    except Exception:
        log.warning("an image failed to decode", exc_info=True)
        raise ImageRefused("does not decode: it is corrupt") from None


def _cleaned(opened: Image.Image, max_pixels: int, declared: str | None) -> Cleaned:
    kind = SAME_AS.get(str(opened.format), str(opened.format))
    media_type = formats()[kind]
    if declared is not None and declared != media_type:
        raise ImageRefused(f"is a {media_type} image, not the {declared} it was sent as")
    width, height = opened.size
    if width * height > max_pixels:
        raise TooLarge(f"is {width} x {height} pixels, more than the {max_pixels} accepted")
    if opened.format not in SAME_AS and getattr(opened, "n_frames", 1) > 1:  # an MPO's other pictures are no frames
        raise ImageRefused("is animated; a still image is needed")
    opened.load()
    has_alpha = opened.mode in ("RGBA", "LA", "PA") or "transparency" in opened.info
    orientation = opened.getexif().get(ExifTags.Base.Orientation, 1)
    turn = _UPRIGHT.get(orientation) if isinstance(orientation, int) else None
    image = _replaced(opened, opened.transpose(turn)) if turn is not None else opened
    mode = "RGBA" if has_alpha and kind != "JPEG" else "RGB"
    image = _replaced(image, image.convert(mode)) if image.mode != mode else image
    # Encoders write some of what the decoded image's `info` holds (a JPEG's comment, a PNG's colour profile)
    # unless told otherwise; without it, the pixels alone are written.
    image.info = {}
    out = io.BytesIO()
    if kind == "JPEG":
        image.save(out, "JPEG", quality=JPEG_QUALITY, optimize=True)
    elif kind == "PNG":
        image.save(out, "PNG", optimize=True)
    else:
        image.save(out, "WEBP", quality=JPEG_QUALITY)
    return Cleaned(out.getvalue(), media_type, image.width, image.height)


def _replaced(image: Image.Image, made: Image.Image) -> Image.Image:
    """`made`, once `image` (which it was made from) is closed: its pixels released before the next step."""
    image.close()
    return made
