"""A Creatomate template: what fills it, what it must have, and what its RenderScript source says of it.

The template's elements are filled by name (docs/providers.md):
`Title`, `Business`, `Region`, `Music.source` (the song's URL), and for each sung line n (from 1)
`Caption-n` with `Caption-n.time` and `Caption-n.duration` in seconds; `Caption-n` past the song's
last line (up to MAX_CAPTIONS) is blanked, so the template's own text never shows. With photos in
the brief, `Photo-n.source` for n from 1 to MAX_PHOTOS, the brief's photos in order and again from
the first when there are fewer, so no image element of the template shows its own picture (an
image element's source is set by a modification as the audio's is: creatomate.com/docs, "API
automation"): each a URL the render API fetches, which `photo_urls` gives (a presigned URL of
the bucket or a signed link of the gateway for an upload; a photo named by an https URL, that
URL). A brief without photos sends no `Photo-n`: the template's pictures show.

A template without an element the video needs (any but a blanked caption or a photo past `Photo-1`) fails the
stage for good (`template_mismatch`), and so does a render whose notes find errors or name such an element
(castad_video.creatomate reads the template and asks for the render).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from typing import Any

from castad_contracts import brief, codes, events
from castad_runtime import redact
from castad_runtime.stage import errors

log = logging.getLogger(__name__)

MAX_CAPTIONS = 60
MAX_PHOTOS = brief.MAX_PHOTOS
QUOTED = re.compile(r"""['"`]([^'"`]{1,100})['"`]""")
ALWAYS_NEEDED = frozenset({"Title", "Business", "Region", "Music", "Caption-1"})  # what every video fills


_LANGUAGE_REGION = {
    brief.Language.KOREAN: "KR",
    brief.Language.ENGLISH: "KR",
    brief.Language.JAPANESE: "JP",
    brief.Language.CHINESE: "SC",
}


def font_family(family: brief.FontFamily, language: brief.Language) -> str | None:
    """The render API's name of a brand's font for a language (a Google Fonts family), if it draws the language.

    The Nanum families draw Korean and English; Nanum Square Round is not one the render API has."""
    if family is brief.FontFamily.NOTO_SANS_CJK:
        return f"Noto Sans {_LANGUAGE_REGION[language]}"
    if family is brief.FontFamily.NOTO_SERIF_CJK:
        return f"Noto Serif {_LANGUAGE_REGION[language]}"
    nanum = family in (brief.FontFamily.NANUM_GOTHIC, brief.FontFamily.NANUM_MYEONGJO)
    return family.value if nanum and language in (brief.Language.KOREAN, brief.Language.ENGLISH) else None


def brand_modifications(done: events.SongCompleted, logo_url: str | None) -> dict[str, Any]:
    """The brief's brand on the template: its colours on the names and title, its font on every text, its logo."""
    brand = done.brief.brand
    if brand is None:
        return {}
    main, accent = brand.colors[0], brand.colors[-1]
    values: dict[str, Any] = {"Title.fill_color": main, "Business.fill_color": main, "Region.fill_color": accent}
    family = font_family(brand.font, done.lyrics.language) if brand.font is not None else None
    if family is not None:
        texts = [
            "Title",
            "Business",
            "Region",
            *(f"Caption-{n}" for n in range(1, min(len(done.timed_lines), MAX_CAPTIONS) + 1)),
        ]
        values |= {f"{name}.font_family": family for name in texts}
    if logo_url is not None:
        values["Logo.source"] = logo_url
    return values


def modifications(
    done: events.SongCompleted, song_url: str, photo_urls: Sequence[str] = (), logo_url: str | None = None
) -> dict[str, Any]:
    """The template's elements by name and what each shows (the module's docstring says which)."""
    values: dict[str, Any] = {
        "Title": done.lyrics.title,
        "Business": done.brief.customer_name,
        "Region": done.brief.region,
        "Music.source": song_url,
    }
    for n, line in enumerate(done.timed_lines[:MAX_CAPTIONS], start=1):
        values[f"Caption-{n}"] = line.text
        values[f"Caption-{n}.time"] = round(line.start_s, 3)
        values[f"Caption-{n}.duration"] = round(max(line.end_s - line.start_s, 0.1), 3)
    for n in range(len(done.timed_lines) + 1, MAX_CAPTIONS + 1):  # the template's own text must not show
        values[f"Caption-{n}"] = ""
    if photo_urls:  # every image element shows one of the brief's photos, none the template's own
        for n in range(1, MAX_PHOTOS + 1):
            values[f"Photo-{n}.source"] = photo_urls[(n - 1) % len(photo_urls)]
    return values | brand_modifications(done, logo_url)


def needed(done: events.SongCompleted) -> frozenset[str]:
    """The template's elements the video cannot do without: all it is sent but the blanked captions."""
    lines = min(len(done.timed_lines), MAX_CAPTIONS)
    photo = {"Photo-1"} if done.brief.photos else set()  # without one, the brief's photos would not show at all
    return frozenset({"Title", "Business", "Region", "Music"} | {f"Caption-{n}" for n in range(1, lines + 1)} | photo)


def notes(render: dict[str, Any]) -> list[str]:
    """The render's `errors` and `warnings` as text (strings, or objects with a message)."""
    said: list[str] = []
    for field in ("errors", "warnings"):
        items = render.get(field)
        for item in items if isinstance(items, list) else []:
            text = item.get("message") or item.get("text") or item if isinstance(item, dict) else item
            said.append(redact.mask(str(text))[:300])
    return said


def element_names(source: Any) -> frozenset[str]:
    """Every element's name in a template's RenderScript source, the elements of its compositions included."""
    names: set[str] = set()
    pending = [source]
    while pending:
        item = pending.pop()
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("name"), str):
            names.add(item["name"])
        children = item.get("elements")
        pending.extend(children if isinstance(children, list) else [])
    return frozenset(names)


def check_template(elements: frozenset[str], done: events.SongCompleted) -> None:
    """Fail for good, before anything is paid for, if the template lacks an element the video needs."""
    missing = sorted(needed(done) - elements)
    if missing:
        raise errors.ProviderError(
            codes.ErrorCode.TEMPLATE_MISMATCH,
            f"the video template has no element {', '.join(missing[:5])} (named in docs/providers.md)",
            retryable=False,
            detail=f"the template's elements: {', '.join(sorted(elements))}"[:1000],
        )


def check_notes(render: dict[str, Any], done: events.SongCompleted) -> tuple[str, ...]:
    """Log what the API said of the render's modifications and give it back for the attempt.

    Fail if it found errors, or names an element the video needs.
    """
    said = notes(render)
    if not said:
        return ()
    log.warning("the render API's notes on render %s: %s", render.get("id"), " | ".join(said))
    if isinstance(render.get("errors"), list) and render["errors"]:
        raise errors.ProviderError(
            codes.ErrorCode.TEMPLATE_MISMATCH,
            "the render API found errors in what the stage sent the template",
            retryable=False,
            detail="; ".join(said)[:1000],
        )
    must = needed(done)
    missing = sorted({name.split(".")[0] for text in said for name in QUOTED.findall(text)} & must)
    if missing:
        raise errors.ProviderError(
            codes.ErrorCode.TEMPLATE_MISMATCH,
            f"the video template has no element {', '.join(missing[:5])} (named in docs/providers.md)",
            retryable=False,
            detail="; ".join(said)[:1000],
        )
    return tuple(said)


@dataclasses.dataclass(frozen=True)
class Template:
    """What a template's RenderScript source says of it: its elements' names and its frame size (None: not said)."""

    elements: frozenset[str] | None
    size: tuple[int, int] | None = None


def shape_of(size: tuple[int, int]) -> brief.Format | None:
    """The format a frame of `size` has (within 1%), if any."""
    width, height = size
    return next(
        (shape for shape in brief.Format if abs(width * shape.ratio[1] / (height * shape.ratio[0]) - 1) < 0.01), None
    )


def described(source: object) -> Template:
    """What a template's RenderScript `source` (its JSON object, if it has one) says of it."""
    return Template(element_names(source), _size(source)) if isinstance(source, dict) else Template(None)


def _size(source: dict[str, Any]) -> tuple[int, int] | None:
    """A RenderScript source's frame size, if it says one."""
    width, height = source.get("width"), source.get("height")
    if isinstance(width, int | float) and isinstance(height, int | float) and width > 0 and height > 0:
        return int(width), int(height)
    return None
