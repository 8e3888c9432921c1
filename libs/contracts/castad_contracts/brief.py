"""The brief a client submits: the one input of a pipeline."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints


class Language(enum.StrEnum):
    KOREAN = "Korean"
    ENGLISH = "English"


class Orientation(enum.StrEnum):
    VERTICAL = "vertical"
    HORIZONTAL = "horizontal"


class Genre(enum.StrEnum):
    KPOP = "k-pop"
    BALLAD = "ballad"
    HIPHOP = "hip-hop"
    ROCK = "rock"
    JAZZ = "jazz"
    TROT = "trot"
    ACOUSTIC = "acoustic"


def no_control_characters(value: str) -> str:
    if any(ord(char) < 32 and char not in "\n\t" for char in value):
        raise ValueError("control characters are not allowed")
    return value


def text(min_length: int, max_length: int) -> object:
    """Free text: stripped, within the lengths, without control characters but newline and tab."""
    return Annotated[
        str,
        StringConstraints(strip_whitespace=True, min_length=min_length, max_length=max_length),
        AfterValidator(no_control_characters),
    ]


Name = text(1, 80)
Details = text(0, 500)

MIN_DURATION_S = 3
MAX_DURATION_S = 180
DEFAULT_DURATION_S = 30


class Brief(BaseModel):
    """What the business wants a video about."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    customer_name: Name = Field(  # type: ignore[valid-type]
        description="Name of the business, as it should be sung.", examples=["스테이 머뭄"]
    )
    region: Name = Field(  # type: ignore[valid-type]
        description="Town or district the business is in.", examples=["군산"]
    )
    detail_region_info: Details = Field(  # type: ignore[valid-type]
        default="",
        description="Free text about the place: what it offers, what is nearby.",
        examples=["바다가 보이는 조용한 한옥 스테이"],
    )
    language: Language = Field(default=Language.KOREAN, description="Language of the lyrics.")
    genre: Genre = Field(default=Genre.KPOP, description="Musical genre of the song.")
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
