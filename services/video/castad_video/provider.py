"""Video providers: caption a song with its lyrics and encode an MP4."""

from __future__ import annotations

import dataclasses
import errno
import logging
import pathlib
import random
import re
import shutil
import signal
import subprocess
import tempfile
import wave
from collections.abc import Sequence
from typing import Protocol

import imageio_ffmpeg
import numpy as np
from castad_contracts import brief, codes, events
from castad_runtime import outages
from castad_runtime.stage import cancellation, errors
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from castad_video import slideshow

log = logging.getLogger(__name__)

FONT_ENV = "CASTAD_VIDEO_FONT_PATH"


@dataclasses.dataclass(frozen=True)
class Font:
    """A font file, and the face to use when it is a collection (.ttc)."""

    path: pathlib.Path
    index: int = 0

    def at(self, size: int) -> ImageFont.FreeTypeFont:
        return ImageFont.truetype(str(self.path), size, index=self.index)


_NANUM = tuple(
    pathlib.Path("/usr/share/fonts/truetype/nanum", name) for name in ("NanumGothicBold.ttf", "NanumGothic.ttf")
)
_NOTO_DIRS = ("/usr/share/fonts/opentype/noto", "/usr/share/fonts/truetype/noto")
_NOTO_CJK = tuple(
    pathlib.Path(folder, name) for folder in _NOTO_DIRS for name in ("NotoSansCJK-Bold.ttc", "NotoSansCJK-Regular.ttc")
)
# Noto Sans CJK collections hold one face per region, each with that region's glyph forms.
_NOTO_CJK_FACE = {
    brief.Language.JAPANESE: 0,
    brief.Language.KOREAN: 1,
    brief.Language.CHINESE: 2,
    brief.Language.ENGLISH: 1,
}
_NANUM_DIR = _NANUM[0].parent
# The files of each family a brand may name (brief.FontFamily), bold as the captions are, where Debian's packages put
# them: for the Noto collections, the face of each language's region (_NOTO_CJK_FACE).
FAMILY_FILES = {
    brief.FontFamily.NANUM_GOTHIC: (_NANUM_DIR / "NanumGothicBold.ttf",),
    brief.FontFamily.NANUM_MYEONGJO: (_NANUM_DIR / "NanumMyeongjoBold.ttf",),
    brief.FontFamily.NANUM_SQUARE_ROUND: (_NANUM_DIR / "NanumSquareRoundB.ttf",),
    brief.FontFamily.NOTO_SANS_CJK: tuple(pathlib.Path(folder, "NotoSansCJK-Bold.ttc") for folder in _NOTO_DIRS),
    brief.FontFamily.NOTO_SERIF_CJK: tuple(pathlib.Path(folder, "NotoSerifCJK-Bold.ttc") for folder in _NOTO_DIRS),
}
KNOWN_FONTS: dict[brief.Language, tuple[Font, ...]] = {
    language: (
        *(Font(path) for path in _NANUM if language in (brief.Language.KOREAN, brief.Language.ENGLISH)),
        *(Font(path, _NOTO_CJK_FACE[language]) for path in _NOTO_CJK),
    )
    for language in brief.Language
}
# Text a caption font must draw for a language: its own letters (for Japanese and Chinese, forms
# a Korean font's Hanja lack), and Latin for names and tags.
SAMPLES = {
    brief.Language.KOREAN: "가힣A",
    brief.Language.ENGLISH: "Aa",
    brief.Language.JAPANESE: "あア駅円A",
    brief.Language.CHINESE: "汉书这A",
}
_FC_LANG = {
    brief.Language.KOREAN: "ko",
    brief.Language.ENGLISH: "en",
    brief.Language.JAPANESE: "ja",
    brief.Language.CHINESE: "zh-cn",
}
FONT_PACKAGES = "Debian's fonts-nanum (Korean) and fonts-noto-cjk (Japanese, Chinese)"
STDERR_TAIL_LINES = 12
# The length is cut where each stream is read or made (the song's `-t` as an input option, the video's frame
# count), never by an output `-t`: ffmpeg 9's threaded pipeline then holds both streams in one sync queue, and
# on busy cores it stopped for good, every thread waiting on another, within a few encodes of 3 s videos (none in
# 800 encodes without it). Should it stop for any other reason, an encode is given ENCODE_S_PER_S of wall time a
# second of video (at least ENCODE_MIN_S; a 30 s video took 21-73 s on two busy cores), then killed and run once
# more.
ENCODE_S_PER_S = 10.0
ENCODE_MIN_S = 120.0
ENCODE_TRIES = 2
MAX_CAPTION_LINES = 3
HEADER_LINES = 2
MIN_FONT_PX = 8
_UNASSIGNED = "\uffff"

Rgb = tuple[int, int, int]


class VideoProvider(Protocol):
    def frame(self, shape: brief.Format) -> tuple[int, int]:
        """The (width, height) of its videos in `shape`."""
        ...

    def render(
        self,
        brief: brief.Brief,
        lyrics: events.Lyrics,
        timed_lines: Sequence[events.TimedLine],
        song_path: pathlib.Path,
        out_path: pathlib.Path,
        seed: str,
        *,
        cancel: cancellation.Cancellation,
        photos: Sequence[pathlib.Path] = (),
        bars_s: Sequence[float] = (),
        shape: brief.Format | None = None,
        logo: pathlib.Path | None = None,
    ) -> Video:
        """The video in `shape` (default: the brief's first format), laid out for that frame, in the brief's brand.

        `logo`: the file of the brand's logo."""
        ...


@dataclasses.dataclass(frozen=True)
class Video:
    width: int
    height: int
    duration_s: float
    poster_s: float = 0.0  # when the video shows what its poster should: the business's name over the first photo


class FontNotFound(LookupError):
    """No installed font can draw a language's captions."""


def _glyph_pixels(font: ImageFont.FreeTypeFont, text: str) -> bytes:
    size = int(font.size * 2)
    image = Image.new("L", (size, size))
    ImageDraw.Draw(image).text((size // 4, size // 4), text, font=font, fill=255)
    return image.tobytes()


def draws(font: Font, language: brief.Language) -> bool:
    """Whether the font has a real glyph for every character of the language's sample, not its notdef box."""
    try:
        face = font.at(48)
    except OSError:
        return False
    missing = _glyph_pixels(face, _UNASSIGNED)
    return all(
        any(pixels) and pixels != missing for pixels in (_glyph_pixels(face, char) for char in SAMPLES[language])
    )


def _fc_match(language: brief.Language) -> list[Font]:
    fc_match = shutil.which("fc-match")
    if fc_match is None:
        return []
    try:
        found = subprocess.run(
            [fc_match, "--format=%{file}\t%{index}", f":lang={_FC_LANG[language]}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    path, _, index = found.stdout.strip().partition("\t")
    return [Font(pathlib.Path(path), int(index) if index.isdigit() else 0)] if found.returncode == 0 and path else []


def find_font(language: brief.Language, explicit: pathlib.Path | None = None) -> Font:
    """The explicit font if it draws the language, else the first installed font that does."""
    candidates = [Font(explicit)] if explicit is not None else []
    for candidate in (*candidates, *KNOWN_FONTS[language], *_fc_match(language)):
        if candidate.path.is_file() and draws(candidate, language):
            return candidate
    raise FontNotFound(f"no font that can draw {language} was found; install {FONT_PACKAGES} or set {FONT_ENV}")


def family_font(family: brief.FontFamily, language: brief.Language) -> Font | None:
    """The font of a brand's family for a language, if it is installed and draws the language."""
    for path in FAMILY_FILES[family]:
        font = Font(path, _NOTO_CJK_FACE[language] if path.suffix == ".ttc" else 0)
        if path.is_file() and draws(font, language):
            return font
    return None


def frame_size(shape: brief.Format, short_side: int) -> tuple[int, int]:
    """(width, height) with an exact 9:16, 1:1 or 16:9 aspect and even sides, short side rounded down to 18k."""
    unit = max(short_side // 18, 1)
    short, long = 18 * unit, 32 * unit
    return {brief.Format.VERTICAL: (short, long), brief.Format.SQUARE: (short, short)}.get(shape, (long, short))


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
        font: Font,
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


@dataclasses.dataclass(frozen=True)
class Shot:
    """One caption layer on screen: a lyric line, or the title card when text is None.

    `sung` is how many characters of the caption have been sung (karaoke), None when not known.
    """

    text: str | None
    chorus: bool
    duration_s: float
    sung: int | None = None


def shots(lyrics: events.Lyrics, timed_lines: Sequence[events.TimedLine], duration_s: float) -> list[Shot]:
    """The title card until the first line, then each line until the next one starts; sums to duration_s.

    A line whose syllables are timed is shown once per syllable, each time with what has been sung
    so far highlighted (from the syllable's start).
    """
    chorus_lines = {line for section in lyrics.sections if section.kind == "chorus" for line in section.lines}
    starts: list[tuple[float, str | None, int | None]] = [(0.0, None, None)]
    for line in timed_lines:
        moments: list[tuple[float, int | None]] = [(line.start_s, None)] if not line.syllables else []
        moments += [(syllable.start_s, syllable.at + len(syllable.text)) for syllable in line.syllables]
        for time, sung in moments:
            start = min(max(time, starts[-1][0]), duration_s)
            starts.append((start, line.text, sung))
    ends = [start for start, _, _ in starts[1:]] + [duration_s]
    return [
        Shot(text, text in chorus_lines, end - start, sung)
        for (start, text, sung), end in zip(starts, ends, strict=True)
        if end - start > 1e-3
    ]


def poster_moment(plan: Sequence[Shot]) -> float:
    """The middle of the title card (the business's name, its region and the song's title over the first photo).

    The start of the video if the singing begins at once, with no title card shown.
    """
    if not plan or plan[0].text is not None:
        return 0.0
    return plan[0].duration_s / 2


def still(
    video: pathlib.Path,
    at_s: float,
    out_path: pathlib.Path,
    cancel: cancellation.Cancellation,
    ffmpeg: str | None = None,
) -> None:
    """The frame of `video` shown at `at_s`, as a JPEG of the video's size (its poster)."""
    command = [
        ffmpeg or imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
        "-ss", f"{at_s:.3f}", "-i", str(video), "-frames:v", "1", "-q:v", "3", "-f", "image2", str(out_path),
    ]  # fmt: skip
    try:
        done = cancel.run(command, timeout_s=ENCODE_MIN_S)
    except subprocess.TimeoutExpired:
        raise errors.RetryableProviderError(
            codes.ErrorCode.RENDER_INTERRUPTED, f"ffmpeg took a still of the video for more than {ENCODE_MIN_S:g} s"
        ) from None
    check_render(done)
    if not out_path.exists() or out_path.stat().st_size == 0:
        raise errors.PermanentProviderError(codes.ErrorCode.RENDER_FAILED, f"no frame of the video at {at_s:.3f} s")


def song_duration(song_path: pathlib.Path, ffmpeg: str | None = None) -> float:
    """Seconds of the song: a WAV's from its header, any other audio's (a music API's MP3) as ffmpeg reads it."""
    if not song_path.is_file():
        raise errors.PermanentProviderError(codes.ErrorCode.SONG_MISSING, f"no song file at {song_path}")
    with song_path.open("rb") as head:
        riff = head.read(4) == b"RIFF"
    if riff or ffmpeg is None:
        try:
            with wave.open(str(song_path), "rb") as song:
                duration = song.getnframes() / song.getframerate()
        except (wave.Error, EOFError) as error:
            raise errors.PermanentProviderError(
                codes.ErrorCode.SONG_UNREADABLE, f"{song_path} is not a WAV file: {error}"
            ) from error
    else:
        duration = _probed_duration(song_path, ffmpeg)
    if duration <= 0:
        raise errors.PermanentProviderError(codes.ErrorCode.SONG_UNREADABLE, f"{song_path} holds no audio")
    return duration


FFMPEG_DURATION = re.compile(r"Duration: (\d+):(\d\d):(\d\d(?:\.\d+)?)")


def _probed_duration(song_path: pathlib.Path, ffmpeg: str) -> float:
    """The duration ffmpeg reads off an audio file's header (`ffmpeg -i` with no output prints it, then fails)."""
    try:
        result = subprocess.run(
            [ffmpeg, "-nostdin", "-hide_banner", "-i", str(song_path)], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        raise errors.RetryableProviderError(
            codes.ErrorCode.RENDER_FAILED, f"ffmpeg did not read {song_path} in 30 s"
        ) from None
    found = FFMPEG_DURATION.search(result.stderr)
    if found is None or "Audio:" not in result.stderr:
        raise errors.PermanentProviderError(codes.ErrorCode.SONG_UNREADABLE, f"{song_path} is no audio ffmpeg reads")
    hours, minutes, seconds = found.groups()
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def _concat_list(plan: Sequence[Shot], frames: Sequence[pathlib.Path]) -> str:
    entries = [f"file '{frame.name}'\nduration {shot.duration_s:.6f}" for shot, frame in zip(plan, frames, strict=True)]
    # The concat demuxer ignores the last duration unless the last file is listed once more.
    return "\n".join(["ffconcat version 1.0", *entries, f"file '{frames[-1].name}'", ""])


@dataclasses.dataclass(frozen=True)
class Backdrop:
    """A still behind the captions for `frames` frames.

    A photo's canvas whose window drifts to `end`, or the gradient (`end` None), which stands still.
    """

    path: pathlib.Path
    end: tuple[float, float] | None
    frames: int


class LocalVideoProvider:
    """Draws the captions with Pillow and has ffmpeg move over the photos and encode them with the song.

    The photos are a slideshow (castad_video.slideshow): each cropped around its centre of interest, slowly
    zoomed towards it by ffmpeg's zoompan, one after the other on the song's bars. The captions are transparent
    layers, one per change, laid over the moving photos by ffmpeg (so Python draws a still per caption, not a
    frame per frame). Without photos a gradient of the style's colours stays behind the captions.

    ffmpeg runs through the attempt's cancellation: in a session of its own (a stop signal
    sent to the service's process group does not reach it) and killed as soon as the
    attempt is cancelled (timed out, the service stopping, the claim lost). An ffmpeg killed
    by a signal it was not sent by the attempt (the kernel's out-of-memory killer, an
    operator) fails the render retryably; a full disk is an outage, not the render's fault.
    """

    def __init__(
        self,
        short_side: int = 720,
        fps: int = 24,
        font_path: pathlib.Path | None = None,
        ffmpeg: str | None = None,
    ) -> None:
        self._short_side = short_side
        self._fps = fps
        # A service that cannot draw every language's captions does not start (FontNotFound).
        self.fonts = {language: find_font(language, font_path) for language in brief.Language}
        self._family_fonts: dict[tuple[brief.FontFamily, brief.Language], Font | None] = {}
        self._ffmpeg = ffmpeg or imageio_ffmpeg.get_ffmpeg_exe()

    def frame(self, shape: brief.Format) -> tuple[int, int]:
        return frame_size(shape, self._short_side)

    def font_for(self, source: brief.Brief, language: brief.Language) -> Font:
        """The brand's font for the language if it draws it, else the language's own."""
        family = source.brand.font if source.brand is not None else None
        if family is not None and (key := (family, language)) not in self._family_fonts:
            self._family_fonts[key] = family_font(family, language)
        chosen = self._family_fonts.get((family, language)) if family is not None else None
        if family is not None and chosen is None:
            log.info(
                "the brand's font %s does not draw %s: the captions use %s",
                family,
                language,
                self.fonts[language].path.name,
            )
        return chosen or self.fonts[language]

    def render(
        self,
        brief: brief.Brief,
        lyrics: events.Lyrics,
        timed_lines: Sequence[events.TimedLine],
        song_path: pathlib.Path,
        out_path: pathlib.Path,
        seed: str,
        *,
        cancel: cancellation.Cancellation,
        photos: Sequence[pathlib.Path] = (),
        bars_s: Sequence[float] = (),
        shape: brief.Format | None = None,
        logo: pathlib.Path | None = None,
    ) -> Video:
        """The video of the song with the lyrics as captions, over the photos or a gradient, in `shape`.

        Over `photos` in turn (a slideshow cut on the bars of `bars_s`, else on sung lines) or, without any, over a
        gradient of the style's colours. Every layer is drawn for the frame of `shape` (default: the brief's first
        format), each photo framed for it: no format is cropped from another.
        """
        duration = song_duration(song_path, self._ffmpeg)
        size = self.frame(shape or brief.frames[0])
        font = self.font_for(brief, lyrics.language)
        shown = None if logo is None else _read_logo(logo, max(round(LOGO_SIDE * min(size)), 1))
        renderer = FrameRenderer(brief, size, font, seed, photos=bool(photos), logo=shown)
        plan = shots(lyrics, timed_lines, duration)
        moments = bars_s or [line.start_s for line in timed_lines]
        counts = slideshow.frame_counts(slideshow.photo_cuts(duration, len(photos), moments), duration, self._fps)
        with tempfile.TemporaryDirectory(prefix="castad-video-") as workdir:
            folder = pathlib.Path(workdir)
            layers = self._write_layers(renderer, lyrics.title, plan, folder, cancel)
            listing = folder / "layers.ffconcat"
            listing.write_text(_concat_list(plan, layers), encoding="utf-8")
            if photos:
                backgrounds = self._write_canvases(photos, counts, size, folder, cancel)
            else:
                still = folder / "background.png"
                renderer.background().save(still, compress_level=1)
                backgrounds = [Backdrop(still, None, slideshow.first_frame(duration, self._fps))]
            self._encode(listing, backgrounds, song_path, out_path, size, duration, cancel)
        return Video(width=size[0], height=size[1], duration_s=duration, poster_s=poster_moment(plan))

    @staticmethod
    def _write_layers(
        renderer: FrameRenderer,
        title: str,
        plan: Sequence[Shot],
        workdir: pathlib.Path,
        cancel: cancellation.Cancellation,
    ) -> list[pathlib.Path]:
        written: dict[tuple[str | None, bool, int | None], pathlib.Path] = {}
        layers: list[pathlib.Path] = []
        for shot in plan:
            key = (shot.text, shot.chorus, shot.sung)
            if key not in written:
                cancel.check()
                path = workdir / f"layer-{len(written):04d}.png"
                image = (
                    renderer.title_card(title)
                    if shot.text is None
                    else renderer.caption(shot.text, shot.chorus, shot.sung)
                )
                image.save(path, compress_level=1)
                written[key] = path
            layers.append(written[key])
        return layers

    @staticmethod
    def _write_canvases(
        photos: Sequence[pathlib.Path],
        counts: Sequence[int],
        size: tuple[int, int],
        workdir: pathlib.Path,
        cancel: cancellation.Cancellation,
    ) -> list[Backdrop]:
        """Each photo shown (on for a frame or more) as its canvas, with where its drift ends and its frames."""
        canvases: list[Backdrop] = []
        for number, (photo, frames) in enumerate(zip(photos, counts, strict=True)):
            if frames == 0:
                continue
            cancel.check()
            drawn = slideshow.canvas(_read_photo(photo, slideshow.canvas_size(size)), size)
            path = workdir / f"canvas-{number:02d}.png"
            drawn.image.save(path, compress_level=1)
            canvases.append(Backdrop(path, drawn.end, frames))
        return canvases

    def _encode(
        self,
        listing: pathlib.Path,
        backgrounds: Sequence[Backdrop],
        song_path: pathlib.Path,
        out_path: pathlib.Path,
        size: tuple[int, int],
        duration: float,
        cancel: cancellation.Cancellation,
    ) -> None:
        inputs = ["-f", "concat", "-safe", "0", "-i", str(listing)]
        parts = []
        for number, backdrop in enumerate(backgrounds, start=1):
            if backdrop.end is None:
                inputs += ["-i", str(backdrop.path)]
                # The decoded frame repeated (`-loop 1` would decode the picture again for every frame).
                motion = f"loop=loop={backdrop.frames - 1}:size=1,setpts=N/({self._fps}*TB)"
            else:
                inputs += ["-i", str(backdrop.path)]
                motion = slideshow.zoompan(backdrop.end, backdrop.frames, size, self._fps)
            parts.append(f"[{number}:v]{motion},setsar=1[p{number}]")
        joined = "".join(f"[p{number}]" for number in range(1, len(backgrounds) + 1))
        graph = ";".join(
            [
                *parts,
                f"{joined}concat=n={len(backgrounds)}:v=1:a=0,format=yuv420p[background]",
                "[background][0:v]overlay=eof_action=repeat,format=yuv420p[video]",
            ]
        )
        command = [
            self._ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
            *inputs,
            "-t", f"{duration:.3f}", "-i", str(song_path),
            "-filter_complex", graph,
            "-map", "[video]", "-map", f"{len(backgrounds) + 1}:a:0", "-r", str(self._fps),
            "-frames:v", str(slideshow.first_frame(duration, self._fps)),
            "-c:v", "libx264", "-preset", "veryfast",
            "-c:a", "aac", "-b:a", "128k",
            "-movflags", "+faststart", "-f", "mp4", str(out_path),
        ]  # fmt: skip
        check_render(self._run_encoder(command, duration, cancel))

    def _run_encoder(
        self, command: Sequence[str], duration: float, cancel: cancellation.Cancellation
    ) -> subprocess.CompletedProcess[str]:
        """Run ffmpeg's `command`, killed and run once more if it has not ended in its time.

        Not ending in time is a stalled pipeline; a second stall is the render's retryable failure.
        """
        limit_s = max(ENCODE_MIN_S, ENCODE_S_PER_S * duration)
        for _ in range(ENCODE_TRIES):
            try:
                return cancel.run(command, timeout_s=limit_s)
            except subprocess.TimeoutExpired:
                log.warning("ffmpeg had not ended a %.1f s video in %.0f s: killed", duration, limit_s)
            except OSError as error:
                if outages.is_resource_shortage(error):
                    raise  # no memory or processes left to start ffmpeg: the machine's failure, not the render's
                raise errors.PermanentProviderError(
                    codes.ErrorCode.RENDER_FAILED, f"cannot run {self._ffmpeg}: {error}"
                ) from error
        raise errors.RetryableProviderError(
            codes.ErrorCode.RENDER_INTERRUPTED, f"ffmpeg had not ended in {limit_s:.0f} s, {ENCODE_TRIES} times"
        )


def _read_photo(path: pathlib.Path, canvas: tuple[int, int]) -> Image.Image:
    """A photo of the brief, decoded no larger than it needs to be to fill the canvas.

    Twenty large photos held whole would take gigabytes. The gateway kept it only once it decoded; its bytes were
    checked since.
    """
    try:
        with Image.open(path) as photo:
            scale = max(canvas[0] / photo.width, canvas[1] / photo.height)
            needed = (max(round(photo.width * scale), canvas[0]), max(round(photo.height * scale), canvas[1]))
            photo.draft("RGB", needed)  # a JPEG decodes at a fraction of its size when that is enough
            picture = photo.convert("RGB")
        picture.thumbnail((max(needed[0], 1), max(needed[1], 1)), Image.Resampling.LANCZOS)
        return picture
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise errors.PermanentProviderError(
            codes.ErrorCode.PHOTO_UNREADABLE, f"{path.name} does not decode: {error}"
        ) from None


def _read_logo(path: pathlib.Path, box: int) -> Image.Image:
    """The brand's logo, its transparency kept, fitted in a `box` pixels square."""
    try:
        with Image.open(path) as opened:
            opened.draft("RGBA", (box, box))
            logo = opened.convert("RGBA")
        logo.thumbnail((box, box), Image.Resampling.LANCZOS)
        return logo
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise errors.PermanentProviderError(
            codes.ErrorCode.PHOTO_UNREADABLE, f"the brand's logo does not decode: {error}"
        ) from None


def check_render(result: subprocess.CompletedProcess[str]) -> None:
    """Turn ffmpeg's exit into the render's outcome (a cancelled render never gets here)."""
    if result.returncode == 0:
        return
    tail = "\n".join(result.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
    if result.returncode < 0 or result.returncode in (128 + signal.SIGKILL, 128 + signal.SIGTERM):
        name = signal.Signals(abs(result.returncode) % 128).name
        raise errors.RetryableProviderError(
            codes.ErrorCode.RENDER_INTERRUPTED, f"ffmpeg was killed by {name}. {tail}".strip()
        )
    if "No space left on device" in result.stderr or "Disk quota exceeded" in result.stderr:
        raise OSError(errno.ENOSPC, f"ffmpeg ran out of disk: {tail}")
    raise errors.PermanentProviderError(
        codes.ErrorCode.RENDER_FAILED, tail or f"ffmpeg exited with {result.returncode}"
    )
