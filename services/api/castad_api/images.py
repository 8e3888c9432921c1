"""An uploaded image made safe to keep: decoded, checked, turned upright, re-encoded without its metadata.

Only what decodes as a JPEG, PNG or WebP image is kept, and only after it decoded whole: its
dimensions are read from its header and refused past a pixel limit before any pixel is decoded (a
small file can declare a huge image: a decompression bomb). The image is turned as its EXIF
orientation says, then encoded again from its pixels alone, so that nothing of the upload's
metadata (EXIF with its camera and location, XMP, comments, colour profiles, text chunks) is kept.
"""

from __future__ import annotations

import dataclasses
import io
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

# Pillow's name of each format accepted -> its media type and the suffix of its file.
FORMATS = {"JPEG": ("image/jpeg", ".jpg"), "PNG": ("image/png", ".png"), "WEBP": ("image/webp", ".webp")}
MEDIA_TYPES = tuple(media_type for media_type, _ in FORMATS.values())
JPEG_QUALITY = 90


class ImageRefused(Exception):
    """The upload is not an image this gateway keeps; the message says why."""


@dataclasses.dataclass(frozen=True)
class Cleaned:
    data: bytes
    media_type: str
    suffix: str
    width: int
    height: int


def clean(data: bytes, *, max_bytes: int, max_pixels: int, declared: str | None = None) -> Cleaned:
    """The image in `data`, upright and without metadata, in the format it came in.

    Raises ImageRefused for an empty or too large upload, anything but a JPEG, PNG or WebP image
    (or not the one `declared`, a media type), an animated one, one of more than `max_pixels`
    pixels, and one that does not decode whole (truncated or corrupt).
    """
    if not data:
        raise ImageRefused("is empty")
    if len(data) > max_bytes:
        raise ImageRefused(f"is {len(data)} bytes, more than the {max_bytes} accepted")
    try:
        with warnings.catch_warnings():
            # Pillow warns of an image past its own limit and refuses one twice that; the limit here is checked
            # below, before any pixel is decoded, whatever Pillow's is.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=list(FORMATS))
        with opened:
            return _cleaned(opened, max_pixels, declared)
    except Image.DecompressionBombError:
        raise ImageRefused(f"has more than the {max_pixels} pixels accepted") from None
    except UnidentifiedImageError:
        raise ImageRefused("is not a JPEG, PNG or WebP image") from None
    except (OSError, SyntaxError, ValueError, EOFError):
        raise ImageRefused("does not decode: it is truncated or corrupt") from None


def _cleaned(opened: Image.Image, max_pixels: int, declared: str | None) -> Cleaned:
    media_type, suffix = FORMATS[str(opened.format)]
    if declared is not None and declared != media_type:
        raise ImageRefused(f"is a {media_type} image, not the {declared} it was sent as")
    width, height = opened.size
    if width * height > max_pixels:
        raise ImageRefused(f"is {width} x {height} pixels, more than the {max_pixels} accepted")
    if getattr(opened, "n_frames", 1) > 1:
        raise ImageRefused("is animated; a still image is needed")
    opened.load()
    upright = ImageOps.exif_transpose(opened)
    has_alpha = upright.mode in ("RGBA", "LA", "PA") or "transparency" in upright.info
    converted = upright.convert("RGBA" if has_alpha and opened.format != "JPEG" else "RGB")
    # A new image of the pixels alone: some encoders write what the decoded image's `info` holds (a JPEG's
    # comment, a PNG's colour profile) unless told otherwise.
    pixels = Image.frombytes(converted.mode, converted.size, converted.tobytes())
    out = io.BytesIO()
    if opened.format == "JPEG":
        pixels.save(out, "JPEG", quality=JPEG_QUALITY, optimize=True)
    elif opened.format == "PNG":
        pixels.save(out, "PNG", optimize=True)
    else:
        pixels.save(out, "WEBP", quality=JPEG_QUALITY)
    return Cleaned(out.getvalue(), media_type, suffix, pixels.width, pixels.height)
