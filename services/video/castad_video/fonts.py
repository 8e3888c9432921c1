"""The captions' fonts: the installed font that draws a language, and a brand's family where it is installed.

A service that cannot draw every language's captions does not start (FontNotFound names Debian's packages and
`CASTAD_VIDEO_FONT_PATH`).
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import subprocess

from castad_contracts import brief
from PIL import Image, ImageDraw, ImageFont

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
_UNASSIGNED = "\uffff"


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
