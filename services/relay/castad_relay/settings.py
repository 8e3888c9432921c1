"""Settings of the relay (CASTAD_RELAY_*)."""

from __future__ import annotations

from typing import Annotated

from castad_runtime import settings
from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

SOURCES = ("api", "lyric", "song", "video")


class RelaySettings(settings.CommonSettings):
    model_config = SettingsConfigDict(env_prefix="CASTAD_RELAY_", extra="ignore", frozen=True)

    sources: Annotated[tuple[str, ...], NoDecode] = Field(
        default=tuple(settings.database_url_default(name) for name in SOURCES),
        description="comma-separated database URLs whose outbox tables the relay drains",
    )
    batch_size: int = Field(default=200, ge=1, le=5000, description="rows published per confirm round")
    fallback_poll_s: float = Field(
        default=2.0, gt=0, le=60, description="drain even without a NOTIFY this often (a missed wake-up)"
    )
    confirm_timeout_s: float = Field(default=15.0, gt=0, description="give up on unconfirmed publishes after")
    retry_delay_s: float = Field(
        default=1.0, gt=0, le=60, description="pause after a database or broker error; first backoff of a refused row"
    )
    max_publish_attempts: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="a row the broker refuses for its own sake (unroutable, too large) is parked after this many"
        " tries; broker trouble (a nack, a lost connection) costs no try",
    )
    publish_backoff_max_s: float = Field(default=60.0, gt=0, description="longest wait between tries of a refused row")
    lease_s: float = Field(
        default=6.0,
        ge=1,
        le=300,
        description="a relay leads a database's outbox under a lease this long, renewed every third of it; when"
        " its leader freezes, dies or is cut off, another replica takes over within it and a second",
    )
    health_port: settings.HealthPort = None
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="a larger event is refused at once (RabbitMQ's max_message_size)"
    )

    @field_validator("sources", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("sources")
    @classmethod
    def _postgres(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one database URL")
        for url in value:
            if not url.startswith(("postgresql://", "postgresql+psycopg://")):
                raise ValueError(f"not a PostgreSQL URL: {url}")
        return value
