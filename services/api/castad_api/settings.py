"""Settings of the gateway (CASTAD_API_*)."""

from __future__ import annotations

from castad_runtime import settings
from pydantic import Field
from pydantic_settings import SettingsConfigDict


class ApiSettings(settings.StoreSettings):
    model_config = SettingsConfigDict(env_prefix="CASTAD_API_", extra="ignore", frozen=True)

    database_url: str = Field(
        default=settings.database_url_default("api"),
        pattern=settings.POSTGRES_URL,
        description="the gateway's own database",
    )
    host: str = Field(default="127.0.0.1", description="address the HTTP server binds")
    port: int = Field(default=8000, ge=1, le=65535, description="port the HTTP server binds")
    max_body_bytes: int = Field(default=16_384, ge=1024, description="larger request bodies get 413")
    sse_ping_s: float = Field(default=15.0, gt=0, description="keep-alive comment interval on event streams")
    sse_poll_s: float = Field(default=2.0, gt=0, description="re-read an event stream this often without a NOTIFY")
    consumer_threads: int = Field(default=4, ge=1, le=64, description="Dramatiq threads projecting events")
    page_size_max: int = Field(default=100, ge=1, le=1000, description="largest page of a listing")
    pipeline_deadline_s: float = Field(
        default=7200.0, gt=0, description="a pipeline not ended this long after its request (or retry) is canceled"
    )
    deadline_poll_s: float = Field(default=5.0, gt=0, le=3600, description="how often overdue pipelines are looked for")
    dead_letter_body_max_bytes: int = Field(
        default=262_144,
        ge=1024,
        description="a dead letter's body is kept up to this size (a longer one cannot be replayed)",
    )
