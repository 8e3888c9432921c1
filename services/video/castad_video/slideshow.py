"""The local video's slideshow: where each photo is cropped, when it comes on, and how it moves.

Each photo is cropped to the frame's shape around its centre of interest (the centroid of its detail) into a
canvas a little larger than the frame; ffmpeg's zoompan then moves a window over the canvas, from the whole of it
to `ZOOM` times closer, drifting towards the centre of interest (Ken Burns), one exact number of frames a photo.
The photos follow each other on the song's bar lines nearest to equal parts of the song.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

ZOOM = 1.08  # how much closer a photo is at the end of its time than at its start
INTEREST_SIDE = 96  # pixels of the longer side of the grey image the centre of interest is found on
INTEREST_MARGIN = 0.2  # the centre of interest stays this far (of the photo's side) from each border
# zoompan crops whole pixels of its input: on a canvas 1.5 times the frame's resolution a step is two thirds
# of an output pixel (finer costs more: twice the resolution doubles zoompan's time, and it gains little).
OVERSAMPLE = 1.5
CANVAS_SHORT_MAX = 1200  # pixels of a canvas's shorter side at most: the oversampling is dropped first


def centre_of_interest(photo: Image.Image) -> tuple[float, float]:
    """Where the photo's detail is, as fractions of its width and height, kept INTEREST_MARGIN from each border.

    The detail is the local contrast of a small grey copy (its gradient's magnitude): the centroid of how much
    each pixel's contrast exceeds the photo's median, squared, so a textured object outweighs an evenly grained
    sky or wall. A photo without any contrast is looked at in its middle.
    """
    grey = photo.convert("L")
    grey.thumbnail((INTEREST_SIDE, INTEREST_SIDE), Image.Resampling.BILINEAR)
    pixels = np.asarray(grey, dtype=np.float64)
    if min(pixels.shape) < 3:
        return (0.5, 0.5)
    rows, cols = np.gradient(pixels)
    contrast = np.hypot(rows, cols)[1:-1, 1:-1]  # the borders' one-sided differences are not the photo's
    weights = np.clip(contrast - np.median(contrast), 0.0, None) ** 2
    total = float(weights.sum())
    if total <= 1e-9:
        return (0.5, 0.5)
    height, width = contrast.shape
    x = float((weights.sum(axis=0) * (np.arange(width) + 0.5)).sum()) / total / width
    y = float((weights.sum(axis=1) * (np.arange(height) + 0.5)).sum()) / total / height
    return (_within(x, INTEREST_MARGIN), _within(y, INTEREST_MARGIN))


def _within(value: float, margin: float) -> float:
    return min(max(value, margin), 1.0 - margin)


def crop_box(size: tuple[int, int], frame: tuple[int, int], interest: tuple[float, float]) -> tuple[float, ...]:
    """The largest box of the frame's shape inside a photo of `size`, centred as near `interest` as it fits."""
    width, height = size
    if width * frame[1] > height * frame[0]:
        box_width, box_height = height * frame[0] / frame[1], float(height)
    else:
        box_width, box_height = float(width), width * frame[1] / frame[0]
    left = min(max(interest[0] * width - box_width / 2, 0.0), width - box_width)
    top = min(max(interest[1] * height - box_height / 2, 0.0), height - box_height)
    return (left, top, left + box_width, top + box_height)


def canvas_size(frame: tuple[int, int]) -> tuple[int, int]:
    """The size a photo is drawn at for the frame: ZOOM times larger, oversampled as far as CANVAS_SHORT_MAX lets."""
    scale = ZOOM * min(OVERSAMPLE, max(1.0, CANVAS_SHORT_MAX / (ZOOM * min(frame))))
    return (math.ceil(frame[0] * scale), math.ceil(frame[1] * scale))


@dataclasses.dataclass(frozen=True)
class Canvas:
    """A photo cropped to the frame's shape, and where in it (fractions) the window ends its drift."""

    image: Image.Image
    end: tuple[float, float]


def canvas(photo: Image.Image, frame: tuple[int, int]) -> Canvas:
    """The photo cropped to the frame around its centre of interest, at canvas_size, and its drift's end."""
    interest = centre_of_interest(photo)
    left, top, right, bottom = crop_box(photo.size, frame, interest)
    image = photo.convert("RGB").resize(canvas_size(frame), Image.Resampling.LANCZOS, box=(left, top, right, bottom))
    # The last window (1/ZOOM of the canvas) is centred on the centre of interest as far as it stays inside.
    half = 0.5 / ZOOM
    within = (
        _within((interest[0] * photo.width - left) / (right - left), half),
        _within((interest[1] * photo.height - top) / (bottom - top), half),
    )
    return Canvas(image, within)


def zoompan(end: tuple[float, float], frames: int, size: tuple[int, int], fps: int) -> str:
    """ffmpeg's zoompan drawing `frames` frames of one still.

    Zoom from 1 to ZOOM, the window's centre moving in a straight line from the canvas's centre to `end` (the
    window stays inside the canvas all the way: its centre moves no faster than its half-size shrinks).
    """
    last = max(frames - 1, 1)
    dx, dy = end[0] - 0.5, end[1] - 0.5
    return (
        f"zoompan=z='1+{ZOOM - 1:.6f}*on/{last}'"
        f":x='iw*(0.5{dx:+.6f}*on/{last})-iw/zoom/2'"
        f":y='ih*(0.5{dy:+.6f}*on/{last})-ih/zoom/2'"
        f":d={frames}:s={size[0]}x{size[1]}:fps={fps}"
    )


def photo_cuts(duration_s: float, photos: int, moments: Sequence[float]) -> list[float]:
    """When each photo after the first comes on.

    At the moment (a bar line, else a sung line's start) nearest to the end of an equal part of the song, if one is
    within half a part of it, else at that end; each photo stays on for at least a quarter of a part.
    """
    if photos < 2:
        return []
    part = duration_s / photos
    cuts: list[float] = []
    for number in range(1, photos):
        even = part * number
        earliest = (cuts[-1] if cuts else 0.0) + part / 4
        near = [
            moment
            for moment in moments
            if abs(moment - even) <= part / 2 and earliest <= moment <= duration_s - part / 4
        ]
        cuts.append(min(near, key=lambda moment: abs(moment - even)) if near else max(even, earliest))
    return cuts


def first_frame(time_s: float, fps: int) -> int:
    """The first frame shown at or after `time_s` (frame n is on screen from n / fps)."""
    return math.ceil(round(time_s * fps, 6))


def frame_counts(cuts: Sequence[float], duration_s: float, fps: int) -> list[int]:
    """How many frames each photo is on: from the first frame at or after its cut to the next photo's first."""
    bounds = [0, *(first_frame(cut, fps) for cut in cuts), first_frame(duration_s, fps)]
    return [max(end - start, 0) for start, end in zip(bounds, bounds[1:], strict=False)]
