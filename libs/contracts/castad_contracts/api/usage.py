"""What a tenant used per UTC day, by meter, what it cost, and its budgets."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from castad_contracts import events


class Meter(enum.StrEnum):
    """What a tenant's usage is counted in, per UTC day (GET /v1/usage)."""

    PIPELINES = "pipelines"  # made (a brief, or a remake), when accepted
    LYRIC_CALLS = "lyric_calls"  # requests for work each stage sent its provider (polls are not)
    SONG_CALLS = "song_calls"
    VIDEO_CALLS = "video_calls"
    SONG_SECONDS = "song_seconds"  # of song made
    VIDEO_SECONDS = "video_seconds"  # of video made, each format's counted
    STORED_BYTES = "stored_bytes"  # of files the stages kept (songs, videos, posters, fetched photos, lyrics)


def calls_meter(stage: events.Stage) -> Meter:
    """The meter of the requests for work `stage` sent its provider."""
    return Meter(f"{stage.value}_calls")


class Meters(BaseModel):
    """Usage by meter, and what it cost by the installation's price table (CASTAD_API_PRICES)."""

    pipelines: int = 0
    lyric_calls: int = 0
    song_calls: int = 0
    video_calls: int = 0
    song_seconds: float = 0.0
    video_seconds: float = 0.0
    stored_bytes: int = 0
    estimated_cost: float = Field(default=0.0, description="each meter times its price, summed")


class UsageDay(Meters):
    tenant: str
    day: dt.date = Field(description="a UTC day")


BudgetPeriod = Literal["day", "month"]


class Budget(BaseModel):
    """A tenant's limits for a UTC day or month (castad-admin tenants budget), and what it used of them so far."""

    period: BudgetPeriod
    pipelines: int | None = Field(description="pipelines it may make (null: no limit)")
    song_seconds: float | None = Field(description="seconds of song it may have made (null: no limit)")
    cost: float | None = Field(description="estimated cost it may reach (null: no limit)")
    used: Meters = Field(description="what it used so far this period")
    resets_at: dt.datetime = Field(description="when the period ends and its count starts again")


class Usage(BaseModel):
    """What a tenant used per UTC day (an admin key: every tenant's, or the one it asks for)."""

    tenant: str | None = Field(description="whose (null: every tenant's, for an admin key)")
    from_: dt.date = Field(alias="from", description="the first day counted (UTC)")
    to: dt.date = Field(description="the last day counted (UTC)")
    currency: str = Field(description="of the estimated costs (CASTAD_API_CURRENCY)")
    prices: dict[Meter, float] = Field(description="the price of one unit of each meter priced (CASTAD_API_PRICES)")
    days: list[UsageDay] = Field(description="each tenant's days that used anything, by day then tenant")
    total: Meters = Field(description="the days summed")
    weight: int | None = Field(description="the tenant's weight in the stages' fair turns (null: every tenant's)")
    budgets: list[Budget] = Field(description="the tenant's budgets (none: no limit; empty for every tenant's)")

    model_config = ConfigDict(populate_by_name=True)
