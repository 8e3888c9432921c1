"""Settings of the relay (CASTAD_RELAY_*)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated

from castad_contracts import topology
from castad_runtime import db, redact, settings
from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

SOURCES = tuple(topology.SOURCES)  # the services that produce events, each with an outbox in its database
_NAMED = re.compile(r"^\s*([a-z]+)\s*=\s*(.*?)\s*$")


class RelaySettings(settings.CommonSettings):
    model_config = SettingsConfigDict(env_prefix="CASTAD_RELAY_", extra="ignore", frozen=True)

    sources: Annotated[dict[str, str], NoDecode] = Field(
        default={service: settings.database_url_default(service) for service in SOURCES},
        description="the databases whose outboxes the relay drains, comma-separated, each as `<service>=<URL>`"
        " (api, lyric, song, video): the relay publishes from each only its service's own event types. A plain"
        " URL is taken as the service its database's name ends with (castad_lyric, castad_t1_lyric: lyric)",
    )
    batch_size: int = Field(default=200, ge=1, le=5000, description="rows published per confirm round")
    # In each source database: a relay frozen inside its refusal transaction holds the next leader this long at most.
    db_idle_in_transaction_s: settings.IdleInTransactionS = 10.0
    db_lock_wait_s: settings.LockWaitS = 5.0
    db_statement_s: settings.StatementS = 60.0
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
    def _owned(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        if isinstance(value, Mapping):
            value = [f"{service}={url}" for service, url in value.items()]
        if not isinstance(value, Iterable):
            return value
        owned: dict[str, str] = {}
        for entry in value:
            service, url = _source(str(entry))
            if service in owned:
                raise ValueError(f"two databases of {service}: {redact.mask(owned[service])} and {redact.mask(url)}")
            if url in owned.values():
                raise ValueError(f"one database for two services: {redact.mask(url)}")
            owned[service] = url
        if not owned:
            raise ValueError("at least one database URL")
        return owned


def _source(entry: str) -> tuple[str, str]:
    """The service and URL of a `sources` entry.

    `<service>=<URL>`, or a URL whose database's name ends with the service's (castad_lyric), which says whose it
    is as long as no other service's name could be meant.
    """
    named = _NAMED.match(entry)
    if named and not named.group(1).startswith("postgresql"):
        service, url = named.groups()
        if service not in SOURCES:
            raise ValueError(
                f"{service}={redact.mask(url)}: no service {service!r} has an outbox (one of {', '.join(SOURCES)})"
            )
    else:
        url = entry.strip()
        service = re.split(r"[_-]", db.database_name(url) if url.startswith("postgresql") else "")[-1]
        if service not in SOURCES:
            raise ValueError(
                f"{redact.mask(url)}: its database's name does not say whose outbox it is: write it as <service>=<URL>"
                f" ({', '.join(SOURCES)})"
            )
    if not re.match(settings.POSTGRES_URL, url):
        raise ValueError(f"not a PostgreSQL URL: {redact.mask(url)}")
    return service, url
