"""The brief a client submits: the one input of a pipeline."""

from __future__ import annotations

import enum
import re
import urllib.parse
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator


class Language(enum.StrEnum):
    KOREAN = "Korean"
    ENGLISH = "English"
    JAPANESE = "Japanese"
    CHINESE = "Chinese"


class Orientation(enum.StrEnum):
    VERTICAL = "vertical"
    HORIZONTAL = "horizontal"


class Format(enum.StrEnum):
    """A video's shape, width to height: where a business posts it."""

    VERTICAL = "9:16"  # a reel, a short, a story
    SQUARE = "1:1"  # a feed post
    WIDE = "16:9"  # a video on its page or a screen

    @property
    def slug(self) -> str:
        """The format as a path segment of the gateway's links: 9x16, 1x1, 16x9."""
        return self.value.replace(":", "x")

    @property
    def ratio(self) -> tuple[int, int]:
        """Width to height: (9, 16), (1, 1), (16, 9)."""
        wide, high = self.value.split(":")
        return int(wide), int(high)


# The format each orientation stands for; a brief's formats say it when they begin with one of these.
ORIENTATION_FORMAT = {Orientation.VERTICAL: Format.VERTICAL, Orientation.HORIZONTAL: Format.WIDE}
FORMAT_ORIENTATION = {shape: orientation for orientation, shape in ORIENTATION_FORMAT.items()}


def distinct_formats(formats: tuple[Format, ...]) -> tuple[Format, ...]:
    if len(set(formats)) != len(formats):
        raise ValueError("names the same format more than once")
    return formats


class Style(enum.StrEnum):
    """The musical styles the local providers know; a brief's free-text genre maps to the closest."""

    KPOP = "k-pop"
    BALLAD = "ballad"
    HIPHOP = "hip-hop"
    ROCK = "rock"
    JAZZ = "jazz"
    TROT = "trot"
    ACOUSTIC = "acoustic"


DEFAULT_GENRE = "pop, ambient"  # the seed's own default
DEFAULT_STYLE = Style.KPOP

# Words of a genre (lower case, as written in it) -> the style they point to.
_STYLE_WORDS: dict[Style, tuple[str, ...]] = {
    Style.KPOP: (
        "k-pop",
        "kpop",
        "pop",
        "dance",
        "edm",
        "electro",
        "electronic",
        "synth",
        "disco",
        "idol",
        "케이팝",
        "댄스",
    ),
    Style.BALLAD: ("ballad", "r&b", "rnb", "soul", "ambient", "lo-fi", "lofi", "chill", "piano", "발라드"),
    Style.HIPHOP: ("hip-hop", "hiphop", "hip hop", "rap", "trap", "drill", "힙합", "랩"),
    Style.ROCK: ("rock", "punk", "metal", "grunge", "록", "락"),
    Style.JAZZ: ("jazz", "swing", "bossa", "blues", "lounge", "재즈"),
    Style.TROT: ("trot", "enka", "트로트"),
    Style.ACOUSTIC: ("acoustic", "folk", "guitar", "country", "unplugged", "어쿠스틱", "포크"),
}
_STYLE_PATTERN = re.compile(
    "|".join(sorted((re.escape(w) for words in _STYLE_WORDS.values() for w in words), key=len, reverse=True))
)
_STYLE_OF_WORD = {word: style for style, words in _STYLE_WORDS.items() for word in words}


def closest_style(genre: str) -> Style:
    """The style of the first word of `genre` that names one ("pop, ambient" -> k-pop); the default if none does."""
    found = _STYLE_PATTERN.search(genre.lower())
    return _STYLE_OF_WORD[found.group()] if found else DEFAULT_STYLE


def no_control_characters(value: str) -> str:
    if any(ord(char) < 32 and char not in "\n\t" for char in value):
        raise ValueError("control characters are not allowed")
    return value


# Free text: stripped, within its lengths, without control characters but newline and tab.
_NO_CONTROL = AfterValidator(no_control_characters)
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=80), _NO_CONTROL]
Details = Annotated[str, StringConstraints(strip_whitespace=True, min_length=0, max_length=500), _NO_CONTROL]


GenreText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100), _NO_CONTROL]

MIN_DURATION_S = 3
MAX_DURATION_S = 180
DEFAULT_DURATION_S = 30


MAX_PHOTOS = 20
PHOTO_URL_MAX_LENGTH = 2000
UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
ImageId = Annotated[
    str,
    Field(
        pattern=UUID_PATTERN,
        description="an image id the gateway gave for an upload (POST /v1/images), a lowercase UUID",
    ),
]
ImageMediaType = Literal["image/jpeg", "image/png", "image/webp"]


def http_url(value: str) -> str:
    """An absolute http(s) URL with a host, a valid port and no credentials."""
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError("must be an absolute http or https URL")
    if parsed.username is not None or parsed.password is not None:
        raise ValueError("must not carry credentials")
    try:
        parsed.port  # noqa: B018 (raises ValueError for a port that is not one)
    except ValueError:
        raise ValueError("has a port that is not a number from 0 to 65535") from None
    return value


WebUrl = Annotated[
    str, StringConstraints(strip_whitespace=True, max_length=PHOTO_URL_MAX_LENGTH), AfterValidator(http_url)
]


class PhotoV1(BaseModel):
    """A photo of the business, as events name it: a reference to a file of the artifact store, never its bytes.

    As events named it before the gateway sealed it (pipeline.requested and lyric.completed up to v4, song.completed
    up to v5, video.completed up to v5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: ImageId
    owner: str = Field(
        pattern=r"^[0-9a-f]{32}$",
        description="the place of its tenant's images in the artifact store (a digest of the tenant's name)",
    )
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="of the stored file, metadata stripped")
    media_type: ImageMediaType
    size: int = Field(ge=1, description="size in bytes")


SEAL = Field(
    default=None,
    pattern=r"^[0-9a-f]{64}$",
    # Left out when there is none (a gateway that seals nothing): the event then reads as one of a release before
    # seals.
    exclude_if=lambda seal: seal is None,
    description="the gateway's HMAC-SHA256 of this photo for this pipeline, under a key the video stage holds and"
    " the lyric and song stages do not (castad_runtime.links.photo_seal); a video stage that checks seals uses no"
    " photo whose seal does not hold",
)


class Photo(PhotoV1):
    """An uploaded photo as the gateway names it for one pipeline: sealed, so that no stage can name another's."""

    seal: str | None = SEAL


class PhotoLinkV1(BaseModel):
    """A photo named by its URL in the brief.

    The video stage fetches it (through its guarded outbound client, checked and cleaned as an upload is) when it
    renders. As events named it before the gateway sealed it (see PhotoV1).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: WebUrl = Field(description="where the photo is; https unless the gateway allows otherwise")


class PhotoLink(PhotoLinkV1):
    """A photo named by its URL, as the gateway names it for one pipeline: sealed, so that no stage can change it."""

    seal: str | None = SEAL


class BriefV2(BaseModel):
    """What the business wants a video about (versions 2 of the events carrying it: no photos)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    customer_name: Name = Field(description="Name of the business, as it should be sung.", examples=["스테이 머뭄"])
    region: Name = Field(description="Town or district the business is in.", examples=["군산"])
    detail_region_info: Details = Field(
        default="",
        description="Free text about the place: what it offers, what is nearby.",
        examples=["바다가 보이는 조용한 한옥 스테이"],
    )
    language: Language = Field(default=Language.KOREAN, description="Language of the lyrics.")
    genre: GenreText = Field(
        default=DEFAULT_GENRE,
        description="Musical genre of the song as style tags, free text passed to the music provider as written.",
        examples=["pop, ambient", "acoustic folk"],
    )
    orientation: Orientation = Field(
        default=Orientation.VERTICAL,
        description="vertical (9:16, for shorts) or horizontal (16:9).",
    )
    duration_s: int = Field(
        default=DEFAULT_DURATION_S,
        ge=MIN_DURATION_S,
        le=MAX_DURATION_S,
        description="Length of the song and the video in seconds.",
    )

    @property
    def style(self) -> Style:
        """The local providers' style closest to the genre."""
        return closest_style(self.genre)


class BriefV3(BriefV2):
    """What the business wants a video about, and its uploaded photos.

    Versions 3 of pipeline.requested, lyric.completed and video.completed, version 4 of song.completed.
    """

    photos: tuple[PhotoV1, ...] = Field(
        default=(),
        max_length=MAX_PHOTOS,
        # Left out when there are none: a brief without photos reads as it did before there were any, to the
        # previous version's Brief too (it forbids what it does not know), which a gateway replica or a stage not
        # yet upgraded reads pipelines and jobs with during a rolling upgrade.
        exclude_if=lambda photos: not photos,
        description=f"Up to {MAX_PHOTOS} photos of the business, in the order to show them.",
    )


class BriefV4(BriefV3):
    """What the business wants a video about, and the photos of it to show: uploaded, or named by URL.

    Versions 4 of pipeline.requested and lyric.completed, 5 of song.completed, 4 and 5 of video.completed.
    """

    photos: tuple[PhotoV1 | PhotoLinkV1, ...] = Field(  # type: ignore[assignment]
        default=(),
        max_length=MAX_PHOTOS,
        exclude_if=lambda photos: not photos,
        description=f"Up to {MAX_PHOTOS} photos of the business, in the order to show them: each an upload's"
        " reference or a URL.",
    )


class BriefV5(BriefV4):
    """What the business wants a video about, and the photos of it to show: uploads, sealed, or named by URL.

    Version 5 of pipeline.requested, 5 and 6 of lyric.completed, 6 and 7 of song.completed, 6 to 8 of
    video.completed.
    """

    photos: tuple[Photo | PhotoLink, ...] = Field(
        default=(),
        max_length=MAX_PHOTOS,
        exclude_if=lambda photos: not photos,
        description=f"Up to {MAX_PHOTOS} photos of the business, in the order to show them: each an upload's"
        " reference, sealed by the gateway, or a URL.",
    )


Formats = Annotated[tuple[Format, ...], AfterValidator(distinct_formats)]
HexColour = Annotated[str, StringConstraints(pattern=r"^#[0-9a-fA-F]{6}$", to_lower=True)]
MAX_BRAND_COLOURS = 2


class FontFamily(enum.StrEnum):
    """A family of the fonts the video stage has (Debian's fonts-nanum and fonts-noto-cjk)."""

    NANUM_GOTHIC = "Nanum Gothic"  # Korean and English
    NANUM_MYEONGJO = "Nanum Myeongjo"  # Korean and English, with serifs
    NANUM_SQUARE_ROUND = "Nanum Square Round"  # Korean and English, rounded
    NOTO_SANS_CJK = "Noto Sans CJK"  # every language
    NOTO_SERIF_CJK = "Noto Serif CJK"  # every language, with serifs


class CaptionPosition(enum.StrEnum):
    MIDDLE = "middle"  # under the business's name, a little below the middle
    BOTTOM = "bottom"  # in the lower part of the frame


class CaptionSize(enum.StrEnum):
    SMALL = "small"
    MEDIUM = "medium"
    LARGE = "large"


class CaptionStyle(BaseModel):
    """Where the sung lines stand in the frame and how large."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    position: CaptionPosition = Field(default=CaptionPosition.MIDDLE, description="middle or bottom")
    size: CaptionSize = Field(default=CaptionSize.MEDIUM, description="small, medium or large")


class Brand(BaseModel):
    """A business's brand as a pipeline uses it: its logo, colours, font and caption style (its tenant's kit).

    The logo is an upload of the tenant's, named as a photo is and sealed for the pipeline by the gateway alike."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    logo: Photo | None = Field(default=None, description="the logo shown in a corner of every frame")
    colors: tuple[HexColour, ...] = Field(
        min_length=1,
        max_length=MAX_BRAND_COLOURS,
        description="#rrggbb: the main colour, then the accent (without one, a lighter main). The local renderer paints"
        " the background without photos from the main colour and the region, the rules and what is sung in the"
        " accent; a render API's template takes the main colour for the names and title, the accent for the region",
    )
    font: FontFamily | None = Field(
        default=None, description="the family of the title and captions (where it draws the brief's language)"
    )
    caption_style: CaptionStyle = Field(default_factory=CaptionStyle)


class Brief(BriefV5):
    """What the business wants a video about, the photos of it to show, the formats to make of it, and its brand."""

    formats: Formats = Field(
        default=(),
        max_length=len(Format),
        # Left out when the orientation says it all: such a brief reads as before there were formats, to a release
        # before too (see BriefV3.photos).
        exclude_if=lambda formats: not formats,
        description="The video's formats, each rendered from the one song: 9:16, 1:1, 16:9. The first is the"
        " video's own file and frame size (empty: the orientation's, 9:16 or 16:9).",
    )
    brand: Brand | None = Field(
        default=None,
        exclude_if=lambda brand: brand is None,  # as formats: a brief without one reads as before there were any
        description="The business's brand kit as the pipeline began with it (its tenant's, unless it asked for"
        " none); a kit changed since does not change the pipeline.",
    )

    @model_validator(mode="before")
    @classmethod
    def _orientation_of_first(cls, data: Any) -> Any:
        """Formats beginning with 9:16 or 16:9 set the orientation; that one alone is said by the orientation."""
        formats = data.get("formats") if isinstance(data, dict) else None
        if not isinstance(formats, list | tuple) or not formats or not isinstance(formats[0], str):
            return data  # none, or not formats at all: the field's own validation says so
        orientation = FORMAT_ORIENTATION.get(Format(formats[0])) if formats[0] in set(Format) else None
        if orientation is None:
            return data
        return {**data, "orientation": orientation, "formats": formats if len(formats) > 1 else ()}

    @property
    def frames(self) -> tuple[Format, ...]:
        """Every format to make, the video's own first."""
        return self.formats or (ORIENTATION_FORMAT[self.orientation],)


MIN_REVIEW_TIMEOUT_S = 5
MAX_REVIEW_TIMEOUT_S = 30 * 86_400
DEFAULT_REVIEW_TIMEOUT_S = 3 * 86_400
MAX_REGENERATIONS = 5  # new drafts a review may ask for, after the first


class Review(BaseModel):
    """What a person reviews before the song is paid for, for how long, and what a draft left undecided comes to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lyrics: bool = Field(default=True, description="the lyrics wait for a decision before the song is made")
    timeout_s: int = Field(
        default=DEFAULT_REVIEW_TIMEOUT_S,
        ge=MIN_REVIEW_TIMEOUT_S,
        le=MAX_REVIEW_TIMEOUT_S,
        description="how long each draft waits for a decision, in seconds (5 s to 30 days; default 3 days). The"
        " pipeline's deadline does not run meanwhile",
    )
    on_timeout: Literal["approve", "cancel"] = Field(
        default="cancel",
        description="what a draft that no one decided on comes to: approve (the song is made of it) or cancel (the"
        " pipeline ends CANCELED, review_timeout; nothing more is paid for)",
    )


# What version 1 of the events carrying a brief allowed (see castad_contracts.events).
V1Language = Literal["Korean", "English"]


class BriefV1(BriefV2):
    """A brief as version 1 of the events knew it: a genre from a fixed list, Korean or English."""

    genre: Literal["k-pop", "ballad", "hip-hop", "rock", "jazz", "trot", "acoustic"] = "k-pop"
    language: V1Language = "Korean"  # type: ignore[assignment]
