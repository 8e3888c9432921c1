"""What the local video lays over its background: the title card and the captions, drawn with Pillow.

Each is a transparent layer of the frame's size (shaded at the top and bottom over photos, so the text reads on
any), in the brand's colours or the style's, with the brand's logo in a corner; the gradient behind a video
without photos is drawn here too.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
from castad_contracts import brief
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from castad_video import fonts

MAX_CAPTION_LINES = 3
HEADER_LINES = 2
MIN_FONT_PX = 8

Rgb = tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Palette:
    top: Rgb
    bottom: Rgb
    accent: Rgb
    text: Rgb = (255, 255, 255)
    outline: Rgb = (18, 18, 28)


def rgb(colour: str) -> Rgb:
    """#rrggbb as (r, g, b)."""
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def _shade(colour: Rgb, towards: Rgb, share: float) -> Rgb:
    red, green, blue = (round(a + (b - a) * share) for a, b in zip(colour, towards, strict=True))
    return red, green, blue


def brand_palette(brand: brief.Brand) -> Palette:
    """A brand's colours as a palette: its main colour fading to a darker one, its accent (or a lighter main)."""
    main = rgb(brand.colors[0])
    accent = rgb(brand.colors[1]) if len(brand.colors) > 1 else _shade(main, (255, 255, 255), 0.55)
    return Palette(main, _shade(main, (0, 0, 0), 0.45), accent)


# A caption's font size (of the frame's short side) and its centre's height (of the frame's), by the brand's style.
CAPTION_SCALE = {brief.CaptionSize.SMALL: 0.07, brief.CaptionSize.MEDIUM: 0.085, brief.CaptionSize.LARGE: 0.105}
CAPTION_CENTRE = {brief.CaptionPosition.MIDDLE: 0.56, brief.CaptionPosition.BOTTOM: 0.8}
LOGO_SIDE = 0.16  # of the frame's short side: the box a logo fits in, in the frame's lower right corner
LOGO_MARGIN = 0.04


PALETTES: dict[brief.Style, Palette] = {
    brief.Style.KPOP: Palette((255, 95, 162), (106, 92, 255), (255, 230, 109)),
    brief.Style.BALLAD: Palette((43, 58, 103), (224, 168, 153), (255, 214, 165)),
    brief.Style.HIPHOP: Palette((20, 20, 24), (70, 60, 80), (249, 215, 28)),
    brief.Style.ROCK: Palette((26, 0, 0), (139, 0, 0), (255, 107, 53)),
    brief.Style.JAZZ: Palette((15, 32, 39), (44, 83, 100), (212, 175, 55)),
    brief.Style.TROT: Palette((255, 154, 60), (194, 24, 91), (255, 241, 118)),
    brief.Style.ACOUSTIC: Palette((86, 140, 60), (200, 170, 110), (255, 248, 225)),
}


def _gradient(size: tuple[int, int], palette: Palette) -> Image.Image:
    width, height = size
    rows = np.linspace(0.0, 1.0, height)[:, None]
    cols = np.linspace(0.0, 1.0, width)[None, :]
    mix = (0.8 * rows + 0.2 * cols)[..., None]
    pixels = (1.0 - mix) * np.array(palette.top) + mix * np.array(palette.bottom)
    return Image.fromarray(pixels.astype(np.uint8), "RGB")


def _bokeh(size: tuple[int, int], rng: random.Random) -> Image.Image:
    width, height = size
    short = min(size)
    layer = Image.new("RGBA", size, (255, 255, 255, 0))
    draw = ImageDraw.Draw(layer)
    for _ in range(14):
        radius = rng.uniform(0.04, 0.16) * short
        x, y = rng.uniform(0, width), rng.uniform(0, height)
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=(255, 255, 255, rng.randint(18, 55)))
    return layer.filter(ImageFilter.GaussianBlur(max(short / 60, 1)))


def scrim(size: tuple[int, int]) -> Image.Image:
    """A shade darkest at the top and the bottom, where the header and the captions go over a photo."""
    width, height = size
    rows = np.linspace(-1.0, 1.0, height)
    alpha = (60 + 110 * rows**2).astype(np.uint8)  # 60 of 255 in the middle, 170 at the edges
    layer = np.zeros((height, width, 4), dtype=np.uint8)
    layer[..., 3] = alpha[:, None]
    return Image.fromarray(layer, "RGBA")


class FrameRenderer:
    """Draws what goes over the video's background.

    A title card and one layer per caption (transparent where the background shows), and the background itself when
    there are no photos.

    Over photos the layers shade the frame's top and bottom (the scrim), so the text reads on any photo.
    """

    def __init__(
        self,
        brief: brief.Brief,
        size: tuple[int, int],
        font: fonts.Font,
        seed: str,
        photos: bool = False,
        logo: Image.Image | None = None,
    ) -> None:
        self._brief = brief
        self._size = size
        self._face = font
        self._seed = seed
        self._palette = PALETTES[brief.style] if brief.brand is None else brand_palette(brief.brand)
        self._style = brief.brand.caption_style if brief.brand is not None else None
        self._fonts: dict[int, ImageFont.FreeTypeFont] = {}
        self._clear = scrim(size) if photos else Image.new("RGBA", size, (0, 0, 0, 0))
        # Beside the logo's corner a low caption keeps clear of it (its width on each side of the middle).
        self._beside_logo = 0.0
        if logo is not None:  # on every layer: the title card and each caption
            self._clear = self._with_logo(self._clear, logo)
            self._beside_logo = (LOGO_SIDE + LOGO_MARGIN + 0.02) * min(size)
        self._headed: Image.Image | None = None

    @property
    def size(self) -> tuple[int, int]:
        return self._size

    def background(self) -> Image.Image:
        """The gradient of the style's colours with soft circles: the background of a video without photos."""
        gradient = _gradient(self._size, self._palette).convert("RGBA")
        return Image.alpha_composite(gradient, _bokeh(self._size, random.Random(self._seed))).convert("RGB")

    def title_card(self, title: str) -> Image.Image:
        """The business's name and region large in the middle, the song's title under them."""
        image = self._clear.copy()
        width, height = self._size
        short = min(self._size)
        draw = ImageDraw.Draw(image)
        palette = self._palette
        blocks = [
            (self._caption(self._brief.customer_name, round(0.12 * short), 0.88 * width, 2), palette.text),
            (self._caption(self._brief.region, round(0.07 * short), 0.88 * width, 2), palette.accent),
            (self._caption(title, round(0.06 * short), 0.86 * width, 2), palette.text),
        ]
        extents = [block.box(draw, (0, 0)) for block, _ in blocks]
        gaps = [0.5 * block.font.size for block, _ in blocks[:-1]]
        y = 0.5 * height - (sum(bottom - top for _, top, _, bottom in extents) + sum(gaps)) / 2
        for number, ((block, colour), (_, top, _, bottom)) in enumerate(zip(blocks, extents, strict=True)):
            centre = (width / 2, y + (bottom - top) / 2)
            _drop_shadow(image, block, centre, block.box(draw, centre))
            block.draw(draw, centre, colour, palette.outline)
            y += bottom - top + (gaps[number] if number < len(gaps) else 0.0)
            if number == 1:  # a rule between the business and the song
                rule = y - gaps[number] / 2
                draw.line((0.38 * width, rule, 0.62 * width, rule), fill=palette.accent, width=max(short // 160, 1))
        return image

    def caption(self, text: str, chorus: bool = False, sung: int | None = None) -> Image.Image:
        """A lyric line under the business's name.

        With `sung`, its first `sung` characters (karaoke: what has been sung) stand out.
        """
        colour, highlight = self._palette.text, self._palette.accent
        if chorus:
            colour, highlight = highlight, colour
        if self._headed is None:
            self._headed = self._clear.copy()
            self._header(self._headed)
        image = self._headed.copy()
        scale, centre = 0.085, 0.56
        if self._style is not None:
            scale, centre = CAPTION_SCALE[self._style.size], CAPTION_CENTRE[self._style.position]
        self._centered(image, text, colour, scale, highlight, sung, centre)
        return image

    def _with_logo(self, layer: Image.Image, logo: Image.Image) -> Image.Image:
        """The layer with the logo in its lower right corner, fitted in a box of LOGO_SIDE of the short side."""
        short = min(self._size)
        box = max(round(LOGO_SIDE * short), 1)
        fitted = logo.convert("RGBA")
        fitted.thumbnail((box, box), Image.Resampling.LANCZOS)
        margin = round(LOGO_MARGIN * short)
        at = (self._size[0] - margin - fitted.width, self._size[1] - margin - fitted.height)
        shown = layer.copy()
        shown.alpha_composite(fitted, at)
        return shown

    def _font(self, size: int) -> ImageFont.FreeTypeFont:
        if size not in self._fonts:
            self._fonts[size] = self._face.at(size)
        return self._fonts[size]

    def _header(self, image: Image.Image) -> None:
        """Business name over region, top centre, underlined."""
        width, height = self._size
        short = min(self._size)
        draw = ImageDraw.Draw(image)
        palette = self._palette
        y = 0.05 * height
        for text, scale, colour in (
            (self._brief.customer_name, 0.065, palette.text),
            (self._brief.region, 0.042, palette.accent),
        ):
            caption = self._caption(text, round(scale * short), 0.9 * width, HEADER_LINES)
            _, top, _, bottom = caption.box(draw, (width / 2, 0))
            caption.draw(draw, (width / 2, y - top), colour, palette.outline)
            y += bottom - top + 0.35 * caption.font.size
        draw.line((0.38 * width, y, 0.62 * width, y), fill=palette.accent, width=max(short // 160, 1))

    def _centered(
        self,
        image: Image.Image,
        text: str,
        colour: Rgb,
        scale: float,
        highlight: Rgb | None = None,
        sung: int | None = None,
        height_share: float = 0.56,
    ) -> None:
        width, height = self._size
        widest = 0.86 * width
        if height_share > CAPTION_CENTRE[brief.CaptionPosition.MIDDLE]:  # low: by the logo's corner
            widest = min(widest, width - 2 * self._beside_logo)
        caption = self._caption(text, round(scale * min(self._size)), widest, MAX_CAPTION_LINES)
        centre = (width / 2, height_share * height)
        draw = ImageDraw.Draw(image)
        _drop_shadow(image, caption, centre, caption.box(draw, centre))
        if sung is None or highlight is None:
            caption.draw(draw, centre, colour, self._palette.outline)
        else:
            letters = sum(not char.isspace() for char in text[:sung])
            caption.draw_sung(draw, centre, letters, highlight, colour, self._palette.outline)

    def _caption(self, text: str, size: int, max_width: float, max_lines: int) -> Caption:
        """Text wrapped at the largest font, down to 40% of size, that fits in max_lines."""
        font = self._font(max(size, MIN_FONT_PX))
        lines = wrap(text, font, max_width)
        while len(lines) > max_lines and font.size > max(0.4 * size, MIN_FONT_PX):
            font = self._font(max(int(font.size * 0.9), MIN_FONT_PX))
            lines = wrap(text, font, max_width)
        return Caption("\n".join(lines), font, round(0.25 * font.size), max(round(font.size / 12), 1))


@dataclasses.dataclass(frozen=True)
class Caption:
    """A wrapped text block drawn centred on a point, with an outline."""

    block: str
    font: ImageFont.FreeTypeFont
    spacing: int
    stroke: int

    def box(self, draw: ImageDraw.ImageDraw, centre: tuple[float, float]) -> tuple[float, float, float, float]:
        return draw.multiline_textbbox(
            centre,
            self.block,
            font=self.font,
            anchor="mm",
            align="center",
            spacing=self.spacing,
            stroke_width=self.stroke,
        )

    def draw(
        self,
        draw: ImageDraw.ImageDraw,
        centre: tuple[float, float],
        fill: Rgb | tuple[int, int, int, int],
        outline: Rgb | tuple[int, int, int, int],
    ) -> None:
        draw.multiline_text(
            centre,
            self.block,
            font=self.font,
            anchor="mm",
            align="center",
            spacing=self.spacing,
            fill=fill,
            stroke_width=self.stroke,
            stroke_fill=outline,
        )

    def draw_sung(
        self,
        draw: ImageDraw.ImageDraw,
        centre: tuple[float, float],
        letters: int,
        sung: Rgb,
        unsung: Rgb,
        outline: Rgb,
    ) -> None:
        """Draw the block with its first `letters` non-space characters in `sung`, the rest in `unsung`.

        Each row is laid out as multiline_text lays it out (centred, same line spacing), drawn in two
        pieces so the colour can change inside it.
        """
        left, top, _, _ = self.box(draw, centre)
        rows = self.block.split("\n")
        pitch = self.font.getbbox("A", stroke_width=self.stroke)[3] + self.stroke + self.spacing
        block_width = max(draw.textlength(row, font=self.font) for row in rows)
        for number, row in enumerate(rows):
            width = draw.textlength(row, font=self.font)
            x = left + self.stroke + (block_width - width) / 2
            y = top + self.stroke + number * pitch
            cut = _cut(row, letters)
            letters -= sum(not char.isspace() for char in row[:cut])
            done, rest = row[:cut], row[cut:]
            for piece, fill, at in ((done, sung, x), (rest, unsung, x + draw.textlength(done, font=self.font))):
                if piece:
                    draw.text((at, y), piece, font=self.font, fill=fill, stroke_width=self.stroke, stroke_fill=outline)


def _cut(row: str, letters: int) -> int:
    """Index in `row` just after its first `letters` non-space characters."""
    for index, char in enumerate(row):
        if letters <= 0:
            return index
        letters -= not char.isspace()
    return len(row)


def _drop_shadow(
    image: Image.Image, caption: Caption, centre: tuple[float, float], box: tuple[float, float, float, float]
) -> None:
    """A soft shadow under the caption, blurred only over the caption's own box."""
    offset = max(round(caption.font.size / 14), 1)
    pad = 3 * offset
    left, top = max(int(box[0]) - pad, 0), max(int(box[1]) - pad, 0)
    right, bottom = min(int(box[2]) + 2 * pad, image.width), min(int(box[3]) + 2 * pad, image.height)
    if right <= left or bottom <= top:
        return
    layer = Image.new("RGBA", (right - left, bottom - top), (0, 0, 0, 0))
    shade = (0, 0, 0, 140)
    caption.draw(ImageDraw.Draw(layer), (centre[0] - left + offset, centre[1] - top + offset), shade, shade)
    image.alpha_composite(layer.filter(ImageFilter.GaussianBlur(offset)), dest=(left, top))


def wrap(text: str, font: ImageFont.FreeTypeFont, max_width: float) -> list[str]:
    """Greedy word wrap; a word wider than the line is broken between characters."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        for piece in _pieces(word, font, max_width):
            candidate = f"{current} {piece}" if current else piece
            if current and font.getlength(candidate) > max_width:
                lines.append(current)
                current = piece
            else:
                current = candidate
    return [*lines, current] if current else lines


def _pieces(word: str, font: ImageFont.FreeTypeFont, max_width: float) -> list[str]:
    pieces: list[str] = []
    current = ""
    for char in word:
        if current and font.getlength(current + char) > max_width:
            pieces.append(current)
            current = char
        else:
            current += char
    return [*pieces, current]
