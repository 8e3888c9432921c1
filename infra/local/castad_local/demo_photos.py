"""The demo's photos of its guesthouse, drawn at run time (nothing downloaded, nothing stored in the repository).

Three pictures a guesthouse by the sea would upload: the sea at dusk from the shore, the hanok's tiled
roof under a blue sky, and a room with its window on the sea. Drawn with Pillow from fixed shapes and
colours, so each run makes the same pixels (and, with the same Pillow, the same JPEG bytes: the gateway
then keeps them as the same images).
"""

from __future__ import annotations

import io
from collections.abc import Callable

from PIL import Image, ImageDraw, ImageFilter

SIZE = (960, 720)  # a phone camera's 4:3, held sideways
Colour = tuple[int, int, int]


def _mix(a: Colour, b: Colour, t: float) -> Colour:
    return (round(a[0] + (b[0] - a[0]) * t), round(a[1] + (b[1] - a[1]) * t), round(a[2] + (b[2] - a[2]) * t))


def _gradient(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], top: Colour, bottom: Colour) -> None:
    """Fill `box` with a vertical gradient from `top` to `bottom`."""
    left, upper, right, lower = box
    for y in range(upper, lower):
        draw.line([(left, y), (right, y)], fill=_mix(top, bottom, (y - upper) / max(lower - upper - 1, 1)))


def sea_at_dusk() -> Image.Image:
    """The sea from the shore at dusk: a warm sky, the sun on the horizon, its path on the waves, the sand."""
    picture = Image.new("RGB", SIZE)
    draw = ImageDraw.Draw(picture)
    width, height = SIZE
    horizon = round(height * 0.52)
    _gradient(draw, (0, 0, width, horizon), (64, 80, 150), (250, 170, 110))
    draw.ellipse((width * 0.56, horizon - 70, width * 0.56 + 140, horizon + 70), fill=(255, 214, 120))
    _gradient(draw, (0, horizon, width, round(height * 0.82)), (40, 70, 120), (20, 45, 85))
    for row in range(14):  # the waves, closer and wider towards the shore
        y = horizon + 12 + row * row * 1.3
        for x in range(-40, width, 90 - row * 3):
            offset = (row * 37) % 60
            draw.arc((x + offset, y, x + offset + 50 + row * 4, y + 8 + row), 200, 340, fill=(120, 150, 190), width=2)
    for step in range(12):  # the sun's path on the water
        y = horizon + 8 + step * 16
        half = 60 - step * 3
        draw.line([(width * 0.56 + 70 - half, y), (width * 0.56 + 70 + half, y)], fill=(250, 200, 130), width=4)
    _gradient(draw, (0, round(height * 0.82), width, height), (225, 200, 160), (200, 170, 125))
    return picture


def hanok_roof() -> Image.Image:
    """The guesthouse's tiled hanok roof, its eaves curving up at both ends, under a clear blue sky."""
    picture = Image.new("RGB", SIZE)
    draw = ImageDraw.Draw(picture)
    width, height = SIZE
    _gradient(draw, (0, 0, width, height), (70, 140, 220), (175, 215, 245))
    for cloud in ((120, 90), (620, 60), (780, 170)):
        x, y = cloud
        for dx, dy, r in ((0, 0, 40), (45, -15, 50), (95, 0, 38)):
            draw.ellipse((x + dx - r, y + dy - r * 0.6, x + dx + r, y + dy + r * 0.6), fill=(250, 252, 255))
    eave_y, ridge_y = round(height * 0.55), round(height * 0.30)

    def eave(x: float) -> float:
        """The eaves' height at `x`: their ends lifted."""
        return eave_y - 60 * ((2 * x / width - 1) ** 4)

    roof = [*((x, eave(x)) for x in range(0, width + 1, 8)), (width * 0.80, ridge_y), (width * 0.20, ridge_y)]
    draw.polygon(roof, fill=(58, 62, 70))
    for n in range(1, 26):  # the rows of tiles, from the ridge to the eaves
        top, foot = width * 0.20 + (width * 0.60) * n / 26, width * n / 26
        draw.line([(top, ridge_y), (foot, eave(foot))], fill=(88, 92, 100), width=5)
    draw.rectangle((width * 0.18, ridge_y - 16, width * 0.82, ridge_y + 4), fill=(40, 42, 48))  # the ridge
    draw.rectangle((0, eave_y + 4, width, height), fill=(236, 226, 205))  # the white walls
    for x in range(60, width, 170):  # wooden pillars and lattice doors
        draw.rectangle((x, eave_y + 4, x + 22, height), fill=(120, 78, 44))
        draw.rectangle((x + 40, eave_y + 50, x + 140, height - 40), outline=(120, 78, 44), width=4)
        for k in range(1, 4):
            draw.line([(x + 40, eave_y + 50 + k * 40), (x + 140, eave_y + 50 + k * 40)], fill=(150, 105, 65), width=2)
    return picture


def room_by_the_sea() -> Image.Image:
    """A guest room: a wooden floor, a low bed, a lamp, and a large window with the sea in it."""
    picture = Image.new("RGB", SIZE)
    draw = ImageDraw.Draw(picture)
    width, height = SIZE
    floor = round(height * 0.66)
    _gradient(draw, (0, 0, width, floor), (238, 228, 210), (222, 208, 186))  # the wall
    glow = Image.new("L", SIZE, 0)  # the lamp's warm light on the wall, soft-edged
    ImageDraw.Draw(glow).ellipse((395, floor - 250, 635, floor + 10), fill=90)
    picture.paste((255, 214, 140), (0, 0), glow.filter(ImageFilter.GaussianBlur(40)))
    window = (round(width * 0.38), round(height * 0.10), round(width * 0.92), round(height * 0.52))
    left, top, right, bottom = window
    horizon = round(top + (bottom - top) * 0.5)
    _gradient(draw, (left, top, right, horizon), (120, 185, 235), (200, 230, 250))
    _gradient(draw, (left, horizon, right, bottom), (30, 110, 160), (20, 80, 130))
    draw.rectangle(window, outline=(120, 82, 50), width=12)
    draw.line([((left + right) // 2, top), ((left + right) // 2, bottom)], fill=(120, 82, 50), width=8)
    _gradient(draw, (0, floor, width, height), (176, 124, 80), (150, 102, 64))
    for n in range(12):  # the floorboards, widening towards the viewer
        x = n * width / 11
        draw.line([(x, floor), (x + (x - width / 2) * 0.4, height)], fill=(130, 88, 54), width=3)
    draw.rectangle((40, floor - 70, 420, floor + 60), fill=(245, 245, 240))  # the bed, its quilt and pillow
    draw.rectangle((40, floor - 20, 420, floor + 60), fill=(90, 140, 170))
    draw.rounded_rectangle((60, floor - 100, 200, floor - 60), radius=16, fill=(252, 250, 244))
    draw.rectangle((470, floor - 10, 560, floor + 70), fill=(120, 82, 50))  # a side table and its lamp
    draw.polygon([(480, floor - 110), (550, floor - 110), (565, floor - 50), (465, floor - 50)], fill=(250, 225, 160))
    draw.line([(515, floor - 50), (515, floor - 10)], fill=(80, 60, 40), width=6)
    return picture


PHOTOS: dict[str, Callable[[], Image.Image]] = {
    "sea-at-dusk.jpg": sea_at_dusk,
    "hanok-roof.jpg": hanok_roof,
    "room-by-the-sea.jpg": room_by_the_sea,
}


def jpeg(picture: Image.Image) -> bytes:
    """The picture as a JPEG, as a phone would upload it (without any metadata)."""
    out = io.BytesIO()
    picture.save(out, "JPEG", quality=88, optimize=True)
    return out.getvalue()


def photos() -> dict[str, bytes]:
    """Each of the demo's photos by file name, as JPEG bytes."""
    return {name: jpeg(draw()) for name, draw in PHOTOS.items()}


# The guesthouse's brand: a deep sea blue and a warm sunset gold.
BRAND_COLORS = ("#1b3a6b", "#f4a340")


def logo() -> bytes:
    """The guesthouse's logo as PNG bytes: a gold sun over two blue waves, on a transparent ground."""
    size = 240
    picture = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    draw = ImageDraw.Draw(picture)
    draw.ellipse((20, 20, size - 20, size - 20), fill=(255, 255, 255, 235))
    draw.ellipse((70, 50, 170, 150), fill=(244, 163, 64, 255))
    for top in (132, 164):
        for x in range(30, size - 30, 45):
            draw.arc((x, top, x + 45, top + 30), 180, 360, fill=(27, 58, 107, 255), width=12)
    out = io.BytesIO()
    picture.save(out, "PNG")
    return out.getvalue()
