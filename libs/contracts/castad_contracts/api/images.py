"""Images a tenant uploads, and its brand kit, which shows one as its logo."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict, Field

from castad_contracts import brief


class BrandKitRequest(BaseModel):
    """A tenant's brand kit as a key with `submit` sets it: every brief of the tenant uses it from then on."""

    model_config = ConfigDict(extra="forbid")

    logo: brief.ImageId | None = Field(
        default=None, description="an image the tenant uploaded (POST /v1/images), shown in a corner of every frame"
    )
    colors: list[brief.HexColour] = Field(
        min_length=1,
        max_length=brief.MAX_BRAND_COLOURS,
        description="#rrggbb: the main colour, then the accent",
        examples=[["#0b3d91", "#ffc20e"]],
    )
    font: brief.FontFamily | None = Field(default=None, description="the family of the title and captions")
    caption_style: brief.CaptionStyle = Field(default_factory=brief.CaptionStyle)


class BrandKit(BrandKitRequest):
    """A tenant's brand kit, as set last."""

    model_config = ConfigDict(extra="ignore")  # an answer: what a newer gateway adds is read past

    logo_download: str | None = Field(description="the gateway's path of the logo's file (GET /v1/images/{id}/content)")
    updated_at: dt.datetime


class Image(BaseModel):
    """An uploaded image, as the gateway stored it: decoded, turned upright, its metadata stripped."""

    id: str = Field(description="what a brief's `photos` names it by")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="of the stored bytes (not of the upload)")
    media_type: str = Field(examples=["image/jpeg"])
    size: int = Field(ge=1, description="size in bytes of the stored file")
    width: int = Field(ge=1, description="in pixels, upright")
    height: int = Field(ge=1, description="in pixels, upright")
    created_at: dt.datetime
