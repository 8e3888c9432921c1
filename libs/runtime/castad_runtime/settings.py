"""Settings every Castad process shares, read from CASTAD_* environment variables.

Each service's settings class derives from one of these and adds its own fields
under its own prefix (CASTAD_API_, CASTAD_LYRIC_, ...). Construction validates
every value, so a composition root fails at start on a bad one.
"""

from __future__ import annotations

import os
import pathlib
from typing import Annotated, Literal, Self

from pydantic import AliasChoices, Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from castad_runtime import outbound

DEFAULT_ARTIFACTS_DIR = pathlib.Path("var", "artifacts")
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432"
POSTGRES_URL = r"^postgresql(\+psycopg)?://"
AMQP_URLS = r"^amqps?://[^,\s]+(\s*,\s*amqps?://[^,\s]+)*$"  # one URL or several, comma-separated
DAY_S = 86_400.0

# Where the stages write their files and the gateway reads them (not the relay's business).
ArtifactsDir = Annotated[
    pathlib.Path,
    Field(
        validation_alias=AliasChoices("CASTAD_ARTIFACTS_DIR"),
        description="where the stages write their files and the gateway reads them (relative: from the working"
        " directory)",
    ),
]

# A worker's probe port (see castad_runtime.health).
HealthPort = Annotated[
    int | None, Field(ge=1, le=65535, description="serve /healthz, /readyz and /metrics on this port (off when unset)")
]


# What PostgreSQL ends in every session of a service (db.SessionLimits): a process frozen inside a transaction (a
# paused VM, SIGSTOP, a long pause) holds its row locks only this long, and nothing waits for a lock for ever.
IdleInTransactionS = Annotated[
    float,
    Field(
        ge=0.001,
        le=3600,
        description="a session of the service idle inside a transaction for longer is ended by PostgreSQL"
        " (idle_in_transaction_session_timeout), or (gateway, stages) by the service's own look every quarter of"
        " it where PostgreSQL misses one (after a pipelined batch): a process frozen mid-transaction lets go of its"
        " row locks then, and what it held is taken over as after an outage",
    ),
]
LockWaitS = Annotated[
    float,
    Field(
        ge=0.001,
        le=600,
        description="a statement waiting longer for a lock gives up (lock_timeout): an outage, tried again, no"
        " attempt counted",
    ),
]
StatementS = Annotated[
    float,
    Field(
        ge=0.001,
        le=3600,
        description="a statement of the service running longer is ended by PostgreSQL (statement_timeout): a"
        " bound for a statement gone wrong, far above what any takes here (milliseconds), so it fails as its own"
        " error would, never waited out as an outage; retention's and the metrics' reads set shorter ones",
    ),
]


# The relay's PostgreSQL role, which a service's `migrate` lets into its database (migrations.restrict_access).
OutboxRelayRole = Annotated[
    str | None,
    Field(
        validation_alias=AliasChoices("CASTAD_OUTBOX_RELAY_ROLE"),
        pattern=r"^[a-z_][a-z0-9_-]*$",
        max_length=63,
        description="`migrate` closes the database to every role but its owner and this one (the relay's), which"
        " may read the outbox and mark its rows, and read what the service's replicas read, nothing else; unset:"
        " `migrate` changes no privilege",
    ),
]


def check_key(settings: BaseSettings, field: str) -> None:
    """A network provider's key must be given, as `<field>` or as a readable `<field>_file`."""
    key, key_file = getattr(settings, field), getattr(settings, f"{field}_file")
    name, file_name = env_var(type(settings), field), env_var(type(settings), f"{field}_file")
    if key is None and key_file is None:
        raise ValueError(f"provider {getattr(settings, 'provider', '')} needs {name} or {file_name}")
    if key_file is not None and not os.access(key_file, os.R_OK):
        raise ValueError(f"{file_name} {key_file} cannot be read")


def check_provider_url(settings: BaseSettings, field: str) -> None:
    """A network provider's URL must be https and not name a private host, unless `allow_private` says otherwise."""
    allow_private = getattr(settings, "allow_private", False)
    try:
        outbound.check_url(getattr(settings, field), allow_private)
    except outbound.Refused as error:
        name, allow = env_var(type(settings), field), env_var(type(settings), "allow_private")
        raise ValueError(f"{name}: {error} (local fakes and tests only: {allow}=true)") from None


def env_var(cls: type[BaseSettings], field: str, prefix: str | None = None) -> str:
    """The environment variable that sets `field` of a settings class."""
    alias = cls.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    return f"{cls.model_config.get('env_prefix', '') if prefix is None else prefix}{field}".upper()


def _common(name: str) -> AliasChoices:
    return AliasChoices(f"CASTAD_{name.upper()}")


class _ServiceAmqpUrl(PydanticBaseSettingsSource):
    """`<prefix>AMQP_URL` (CASTAD_LYRIC_AMQP_URL, ...) over CASTAD_AMQP_URL.

    The service's own broker user, where the services of one machine share an environment.
    """

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[object, str, bool]:
        return None, field_name, False  # not used: __call__ reads the one variable itself

    def __call__(self) -> dict[str, object]:
        name = service_amqp_url(self.settings_cls)
        return {env_var(self.settings_cls, "amqp_url"): os.environ[name]} if name else {}


def service_amqp_url(cls: type[BaseSettings]) -> str | None:
    """The variable `<prefix>AMQP_URL` of a service's settings, if it is set."""
    prefix = cls.model_config.get("env_prefix", "")
    name = f"{prefix}AMQP_URL"
    return name if prefix and os.environ.get(name) else None


class CommonSettings(BaseSettings):
    """Settings of every process (variables without a service prefix)."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    amqp_url: Annotated[
        str,
        Field(
            validation_alias=_common("amqp_url"),
            pattern=AMQP_URLS,
            description="RabbitMQ to use: one URL, or one per node of a cluster, comma-separated (each process tries"
            " them in an order of its own and moves to the next when its node goes); CASTAD_<SERVICE>_AMQP_URL"
            " (CASTAD_API_, CASTAD_RELAY_, CASTAD_LYRIC_, ...) overrides it for one service, so that services"
            " sharing an environment each use their own user",
        ),
    ] = "amqp://guest:guest@127.0.0.1:5672/%2F"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _ServiceAmqpUrl(settings_cls), env_settings, dotenv_settings, file_secret_settings

    namespace: Annotated[
        str,
        Field(
            validation_alias=_common("namespace"),
            pattern=r"^[a-z][a-z0-9_-]*$",
            description="prefix of exchange and queue names, so several installations can share a broker",
        ),
    ] = "castad"
    hold_events_s: Annotated[
        float,
        Field(
            validation_alias=_common("hold_events_s"),
            gt=0,
            description="a consumer holds an event it cannot take yet (a newer schema version than it knows, an"
            " operator request ahead of an earlier one) this long before dead-lettering it",
        ),
    ] = 3600.0
    handler_retries: Annotated[
        int,
        Field(
            validation_alias=_common("handler_retries"),
            ge=0,
            le=100,
            description="a handler failing for a reason of its own (not an outage) is tried this many times more,"
            " up to 10 s apart, then its message is dead-lettered",
        ),
    ] = 20
    log_level: Annotated[
        str,
        Field(
            validation_alias=_common("log_level"),
            pattern=r"^(DEBUG|INFO|WARNING|ERROR)$",
            description="DEBUG, INFO, WARNING or ERROR; logs are JSON lines on stderr",
        ),
    ] = "INFO"
    # Retention (castad_runtime.retention): what each service deletes of its own, and when. The services
    # must agree on these: the gateway refuses what a stage's deletions made impossible.
    retention_interval_s: Annotated[
        float,
        Field(
            validation_alias=_common("retention_interval_s"),
            gt=0,
            le=86_400,
            description="how often each service deletes what outlived its retention (CASTAD_RETENTION_*,"
            " CASTAD_API_RETENTION_*), give or take a tenth",
        ),
    ] = 600.0
    retention_batch: Annotated[
        int,
        Field(
            validation_alias=_common("retention_batch"),
            ge=1,
            le=10_000,
            description="rows of retention's first batch, one transaction that skips rows others hold and waits on"
            " none; while a backlog lasts, each full batch quicker than 0.25 s doubles the next, up to 10,000 rows",
        ),
    ] = 500
    retention_pause_s: Annotated[
        float,
        Field(
            validation_alias=_common("retention_pause_s"),
            ge=0,
            le=60,
            description="least pause between two batches of retention, longer after a long batch (retention deletes"
            " at most a fifth of the time), so that the services' own work goes first",
        ),
    ] = 0.2
    retention_outbox_s: Annotated[
        float,
        Field(
            validation_alias=_common("retention_outbox_s"),
            ge=60,
            description="an outbox row is deleted this long after the broker confirmed it (rows not yet published,"
            " or parked, are kept)",
        ),
    ] = 7 * DAY_S
    retention_parked_s: Annotated[
        float,
        Field(
            validation_alias=_common("retention_parked_s"),
            ge=3600,
            description="an outbox row parked this long ago is deleted, with the later rows of its pipeline held"
            " behind it (its pipeline ended by its deadline long before; the gateway's dead letter of it, which an"
            " operator replays, stays for its own retention): each deletion is logged with its count",
        ),
    ] = 90 * DAY_S
    retention_inbox_s: Annotated[
        float,
        Field(
            validation_alias=_common("retention_inbox_s"),
            ge=3600,
            description="a consumer forgets an event it handled this long after (a copy coming later would be taken"
            " as new, so the gateway refuses to replay a dead letter older than this); more than CASTAD_HOLD_EVENTS_S",
        ),
    ] = 30 * DAY_S
    retention_jobs_s: Annotated[
        float,
        Field(
            validation_alias=_common("retention_jobs_s"),
            ge=3600,
            description="a stage deletes a finished job (SUCCEEDED, FAILED, CANCELED) and its attempts this long after"
            " it finished, never before its files; at least CASTAD_RETENTION_ARTIFACTS_S",
        ),
    ] = 30 * DAY_S
    retention_artifacts_s: Annotated[
        float,
        Field(
            validation_alias=_common("retention_artifacts_s"),
            ge=3600,
            description="a stage deletes the files of a finished job this long after it finished; the gateway then"
            " answers their downloads 410 and refuses a retry that would need them; more than"
            " CASTAD_API_PIPELINE_DEADLINE_S",
        ),
    ] = 30 * DAY_S

    @model_validator(mode="after")
    def _retention_keeps_what_is_needed(self) -> Self:
        if self.retention_inbox_s <= self.hold_events_s:
            raise ValueError(
                "CASTAD_RETENTION_INBOX_S must be longer than CASTAD_HOLD_EVENTS_S: a held event comes back that"
                " much later, and its consumer must still know whether it handled it"
            )
        if self.retention_jobs_s < self.retention_artifacts_s:
            raise ValueError(
                "CASTAD_RETENTION_JOBS_S must be at least CASTAD_RETENTION_ARTIFACTS_S: a finished job is how its"
                " stage finds the files to delete"
            )
        return self


def database_url_default(service: str) -> str:
    return f"{DEFAULT_PG}/castad_{service}"


class StoreSettings(CommonSettings):
    """Where artifacts are kept: the settings of every process that writes or serves them."""

    artifacts_dir: ArtifactsDir = DEFAULT_ARTIFACTS_DIR
    artifacts_store: Annotated[
        Literal["volume", "s3"],
        Field(
            validation_alias=_common("artifacts_store"),
            description="`volume`: files under CASTAD_ARTIFACTS_DIR, shared by the stages and the gateway; `s3`: an"
            " S3-compatible bucket (CASTAD_ARTIFACTS_S3_*; credentials from the standard AWS_* variables or the"
            " machine's role), with CASTAD_ARTIFACTS_DIR for scratch files only",
        ),
    ] = "volume"
    artifacts_s3_bucket: Annotated[
        str | None, Field(validation_alias=_common("artifacts_s3_bucket"), min_length=3, description="the bucket")
    ] = None
    artifacts_s3_prefix: Annotated[
        str,
        Field(
            validation_alias=_common("artifacts_s3_prefix"),
            pattern=r"^([A-Za-z0-9._-]+/)*$",
            description="key prefix inside the bucket (empty, or ending in /)",
        ),
    ] = ""
    artifacts_s3_endpoint_url: Annotated[
        str | None,
        Field(
            validation_alias=_common("artifacts_s3_endpoint_url"),
            pattern=r"^https?://",
            description="the endpoint of an S3-compatible store (default: AWS's for the region)",
        ),
    ] = None
    artifacts_s3_region: Annotated[
        str, Field(validation_alias=_common("artifacts_s3_region"), min_length=1, description="the bucket's region")
    ] = "us-east-1"
    artifacts_presign_s: Annotated[
        int,
        Field(
            validation_alias=_common("artifacts_presign_s"),
            ge=60,
            le=604_800,
            description="an artifact download redirects to a presigned URL valid this long (s3)",
        ),
    ] = 900

    @model_validator(mode="after")
    def _bucket_for_s3(self) -> Self:
        if self.artifacts_store == "s3" and not self.artifacts_s3_bucket:
            raise ValueError("CASTAD_ARTIFACTS_STORE=s3 needs CASTAD_ARTIFACTS_S3_BUCKET")
        return self

    @model_validator(mode="after")
    def _no_shared_link_secret(self) -> Self:
        if os.environ.get("CASTAD_LINK_SECRET"):  # read by every service once; now a stage must not hold it
            raise ValueError(
                "CASTAD_LINK_SECRET is no longer read: the gateway's is CASTAD_API_LINK_SECRET, and each signing"
                " stage holds only its own key derived from it (CASTAD_SONG_LINK_SECRET, CASTAD_VIDEO_LINK_SECRET:"
                " python -m castad_api link-secrets); unset it"
            )
        return self
