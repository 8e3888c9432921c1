"""Settings of the gateway (CASTAD_API_*)."""

from __future__ import annotations

import base64
import binascii
import string
from typing import Annotated, Self

from castad_contracts import api
from castad_runtime import settings
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from castad_api import retention, upload_limits, webhook_secrets


class ApiSettings(settings.StoreSettings):
    model_config = SettingsConfigDict(env_prefix="CASTAD_API_", extra="ignore", frozen=True)

    database_url: str = Field(
        default=settings.database_url_default("api"),
        pattern=settings.POSTGRES_URL,
        description="the gateway's own database",
    )
    outbox_relay_role: settings.OutboxRelayRole = None
    db_idle_in_transaction_s: settings.IdleInTransactionS = 10.0
    db_lock_wait_s: settings.LockWaitS = 5.0
    db_statement_s: settings.StatementS = 60.0
    host: str = Field(default="127.0.0.1", description="address the HTTP server binds")
    port: int = Field(default=8000, ge=1, le=65535, description="port the HTTP server binds")
    health_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="serve /healthz, /readyz and /metrics on this port and not on CASTAD_API_PORT, as the stages"
        " serve theirs; unset: on CASTAD_API_PORT",
    )
    max_body_bytes: int = Field(default=16_384, ge=1024, description="larger request bodies get 413")
    image_max_bytes: int = Field(
        default=10_485_760,
        ge=1024,
        description="largest image upload (POST /v1/images) in bytes; larger ones get 413 or 422",
    )
    image_max_pixels: int = Field(
        default=40_000_000,
        ge=1,
        le=89_000_000,
        description="an uploaded image declaring more pixels (width x height) is refused before any is decoded",
    )
    photo_allow_private: bool = Field(
        default=False,
        description="accept photos named by a plain http URL or at a private, loopback or link-local address (local"
        " tests only: the video stage fetches them only with CASTAD_VIDEO_ALLOW_PRIVATE); off: an https URL whose"
        " host is not such an address, checked again after DNS and on redirects by the video stage",
    )
    image_uploads_per_minute: float = Field(
        default=30.0,
        gt=0,
        description="image uploads one tenant may make a minute, after its CASTAD_API_IMAGE_UPLOAD_BURST, counted in"
        " the gateway's database across every replica (refused ones too; more: 429 with Retry-After)",
    )
    image_upload_burst: int = Field(
        default=40,
        ge=1,
        description="image uploads one tenant may make at once before CASTAD_API_IMAGE_UPLOADS_PER_MINUTE applies",
    )
    image_max_per_tenant: int = Field(
        default=2000,
        ge=1,
        description="images one tenant may hold (an upload past them: 409, until retention deletes some)",
    )
    image_max_bytes_per_tenant: int = Field(
        default=2 * 1024**3,
        ge=1024,
        description="bytes of images one tenant may hold, as kept (an upload past them: 409, until retention"
        " deletes some)",
    )
    sse_ping_s: float = Field(default=15.0, gt=0, description="keep-alive comment interval on event streams")
    sse_poll_s: float = Field(
        default=2.0,
        gt=0,
        description="re-read an event stream this often while the gateway's listener is not listening (no"
        " notification can wake it), and while the gateway's database is out",
    )
    sse_sweep_s: float = Field(
        default=45.0,
        gt=0,
        le=3600,
        description="the gateway process looks this often (one query, however many streams it holds) for timeline"
        " entries of the pipelines it holds streams of that no notification told of: one lost without the"
        " listener noticing (a connection cut without a word, a fail-over to a standby, which carries no"
        " notifications) delays its streams by at most about this",
    )
    sse_key_check_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="the keys holding event streams open are looked at again this often: a revoked key's streams"
        " end within it",
    )
    sse_streams_per_key: int = Field(
        default=10,
        ge=1,
        description="event streams one API key may hold open at once on one gateway process (more: 429 with"
        " Retry-After)",
    )
    sse_resume_max_entries: int = Field(
        default=10_000,
        ge=1,
        description="the stream of every pipeline resumed with a Last-Event-ID further back than this many timeline"
        " entries (of every tenant) resumes this many entries back instead",
    )
    consumer_threads: int = Field(
        default=32,
        ge=1,
        le=64,
        description="Dramatiq threads projecting events, each holding one: the events that come while one is"
        " projected wait and are projected together, so the threads bound how many go in one transaction (32 at most)",
    )
    auth_failure_burst: int = Field(
        default=30,
        ge=1,
        description="failed authentications a client address (IPv6: its /64) may make at once; then"
        " CASTAD_API_AUTH_FAILURES_PER_S more a second. Beyond that, its failures get 429 with Retry-After instead"
        " of 401; a key the process found valid in the last hour is still served, a key it has not is looked up"
        " within a small budget of its own",
    )
    auth_failures_per_s: float = Field(
        default=0.5, gt=0, description="how fast a client address earns back a failed authentication"
    )
    forwarded_allow_ips: str = Field(
        default="127.0.0.1",
        description="proxies (comma-separated addresses, or *) whose X-Forwarded-For names the client: the limit of"
        " failed authentications counts per client address",
    )
    creations_per_minute: int = Field(
        default=600, ge=1, description="pipelines one API key may create a minute (more: 429 with Retry-After)"
    )
    page_size_max: int = Field(default=100, ge=1, le=1000, description="largest page of a listing")
    prices: dict[api.Meter, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(
        default={},
        description="the estimated cost of one unit of each meter (GET /v1/usage), as JSON, e.g."
        ' {"song_calls": 0.05, "video_seconds": 0.01}; a meter left out costs nothing',
    )
    currency: str = Field(default="USD", min_length=1, max_length=10, description="of the prices")
    pipeline_deadline_s: float = Field(
        default=7200.0, gt=0, description="a pipeline not ended this long after its request (or retry) is canceled"
    )
    deadline_poll_s: float = Field(default=5.0, gt=0, le=3600, description="how often overdue pipelines are looked for")
    dead_letter_body_max_bytes: int = Field(
        default=262_144,
        ge=1024,
        description="a dead letter's body is kept up to this size (a longer one cannot be replayed)",
    )
    webhook_secrets_key: SecretStr | None = Field(
        default=None,
        description="the key (base64 of 32 random bytes: openssl rand -base64 32) that seals each tenant's webhook"
        " secrets in the gateway's database (castad-admin webhook-secrets); the gateway and that command need the"
        " same one. Unset: no notices are sent, and a brief with a callback_url is refused",
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description="deprecated, only a migration aid: a secret shared by every tenant (whsec_ and base64) that"
        " signs every notice besides the tenant's own, so that receivers still verifying with it keep working"
        " while each moves to its tenant's secret. Any tenant holding it can forge notices to a receiver that"
        " accepts it: unset it once they have moved",
    )
    webhook_allow_private: bool = Field(
        default=False,
        description="let notices go to private, loopback and link-local addresses (off: refused, also after DNS and"
        " on redirects)",
    )
    link_secret: SecretStr | None = Field(
        default=None,
        min_length=32,
        description="the root of the keys that sign the gateway's links network providers use without an API key"
        " (the song a render API fetches, their callbacks) and seal the uploaded photos a brief names for its"
        " pipeline: each signing stage holds only the key derived from it for itself (CASTAD_SONG_LINK_SECRET,"
        " CASTAD_VIDEO_LINK_SECRET: `python -m castad_api link-secrets`); unset: every link is refused and no photo"
        " sealed",
    )
    callback_burst: int = Field(
        default=10,
        ge=1,
        description="callbacks a provider may send about one stage of one pipeline at once; then"
        " CASTAD_API_CALLBACKS_PER_S more a second, per gateway process (beyond: 429 with Retry-After)",
    )
    callbacks_per_s: float = Field(
        default=0.5, gt=0, description="how fast the callbacks of a stage of a pipeline are taken again"
    )
    link_max_s: float = Field(
        default=21_600.0,
        ge=60,
        description="a link whose expiry is further off than this is refused, however well signed; at least a"
        " signing stage's CASTAD_<STAGE>_PROVIDER_GIVE_UP_S and an hour",
    )
    webhook_max_attempts: int = Field(default=8, ge=1, le=50, description="tries of one notice before it fails")
    webhook_backoff_base_s: float = Field(default=5.0, gt=0, description="delay after a notice's first failed try")
    webhook_backoff_max_s: float = Field(default=3600.0, gt=0, description="longest delay between tries of a notice")
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=120, description="longest wait for a receiver's answer")
    webhook_poll_s: float = Field(default=1.0, gt=0, le=60, description="how often due notices are looked for")
    webhook_concurrency: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="notices one gateway process sends at once (each waits for its receiver's answer on a thread"
        " of its own)",
    )
    webhook_per_host: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="notices one gateway process sends at once to one receiving host, so that a slow receiver"
        " leaves the other places to the others' notices; at most CASTAD_API_WEBHOOK_CONCURRENCY",
    )
    retention_timeline_s: float = Field(
        default=30 * settings.DAY_S,
        ge=3600,
        description="the timeline of a pipeline that ended (its event stream) is deleted this long after it ended",
    )
    retention_pipelines_s: float = Field(
        default=90 * settings.DAY_S,
        ge=3600,
        description="a pipeline that ended is deleted this long after it ended, with its stages, attempts, webhook"
        " notices and Idempotency-Key (never while a notice is still being tried); at least"
        " CASTAD_API_RETENTION_TIMELINE_S",
    )
    retention_dead_letters_s: float = Field(
        default=30 * settings.DAY_S,
        ge=3600,
        description="a dead letter replayed or discarded is deleted this long after the last action on it (one still"
        " dead: see CASTAD_API_RETENTION_DEAD_LETTERS_LEFT_S)",
    )
    retention_dead_letters_left_s: float = Field(
        default=90 * settings.DAY_S,
        ge=3600,
        description="a dead letter nobody replayed or discarded is deleted, with its actions, this long after it came"
        " (castad_dead_letters counts those still dead, and an alert names them long before)",
    )
    retention_images_s: float = Field(
        default=7 * settings.DAY_S,
        ge=3600,
        description="an uploaded image is deleted (its record and its file) this long after its last upload once no"
        " pipeline or brand kit names it; one a pipeline names (a photo, its brand's logo) is kept as long as that"
        " pipeline (CASTAD_API_RETENTION_PIPELINES_S after it ended), a kit's logo as long as the kit shows it",
    )
    trace_url: str | None = Field(
        default=None,
        description="a pipeline's trace in a trace viewer, {trace_id} standing for its id (Jaeger:"
        " http://127.0.0.1:16686/trace/{trace_id}); shown on its timeline (unset: no link)",
    )
    stuck_after_s: float = Field(
        default=1860.0,
        gt=0,
        description="a stage RUNNING whose attempt started longer ago is counted stuck in /v1/stats: the longest an"
        " attempt may take (CASTAD_<STAGE>_ATTEMPT_TIMEOUT_S, or _PROVIDER_GIVE_UP_S at a network provider) plus a"
        " lease",
    )
    firehose_max_s: float = Field(
        default=3600.0,
        gt=0,
        description="the stream of every pipeline (/v1/events) closes after this long; a client reconnects with"
        " Last-Event-ID and loses nothing, and long streams spread over the replicas",
    )
    stream_max_s: float = Field(
        default=3600.0,
        gt=0,
        description="a pipeline's stream (/v1/pipelines/{id}/events) closes after this long even if the pipeline"
        " goes on; a client reconnects with Last-Event-ID and loses nothing, and long streams spread over the"
        " replicas",
    )
    docs: bool = Field(
        default=False,
        description="serve Swagger UI at /docs and ReDoc at /redoc, whose pages load their scripts from a public CDN"
        " into the gateway's origin (off: only the OpenAPI document, /openapi.json)",
    )

    def retention_policy(self) -> retention.Policy:
        return retention.Policy(
            inbox_s=self.retention_inbox_s,
            artifacts_s=self.retention_artifacts_s,
            timeline_s=self.retention_timeline_s,
            pipelines_s=self.retention_pipelines_s,
            dead_letters_s=self.retention_dead_letters_s,
            dead_letters_left_s=self.retention_dead_letters_left_s,
            deadline_s=self.pipeline_deadline_s,
            images_s=self.retention_images_s,
        )

    def upload_limits(self) -> upload_limits.Limits:
        return upload_limits.Limits(
            per_minute=self.image_uploads_per_minute,
            burst=self.image_upload_burst,
            max_images=self.image_max_per_tenant,
            max_bytes=self.image_max_bytes_per_tenant,
        )

    @model_validator(mode="after")
    def _retention_outlives_a_run(self) -> Self:
        if self.retention_artifacts_s <= self.pipeline_deadline_s:
            raise ValueError(
                "CASTAD_RETENTION_ARTIFACTS_S must be longer than CASTAD_API_PIPELINE_DEADLINE_S: a running pipeline"
                " reads the files of its earlier stages until its deadline"
            )
        if self.image_max_bytes_per_tenant < self.image_max_bytes:
            raise ValueError(
                "CASTAD_API_IMAGE_MAX_BYTES_PER_TENANT must be at least CASTAD_API_IMAGE_MAX_BYTES: a tenant could not"
                " hold an image it may upload"
            )
        if self.retention_pipelines_s < self.retention_timeline_s:
            raise ValueError(
                "CASTAD_API_RETENTION_PIPELINES_S must be at least CASTAD_API_RETENTION_TIMELINE_S: a pipeline is"
                " deleted with its timeline"
            )
        return self

    @model_validator(mode="after")
    def _per_host_within_concurrency(self) -> Self:
        if self.webhook_per_host > self.webhook_concurrency:
            raise ValueError(
                "CASTAD_API_WEBHOOK_PER_HOST must be at most CASTAD_API_WEBHOOK_CONCURRENCY: a host's notices take"
                " their places among all of them"
            )
        return self

    @field_validator("trace_url")
    @classmethod
    def _trace_template(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            fields = {(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(value) if name}
        except ValueError:
            fields = set()
        if not value.startswith(("http://", "https://")) or fields != {("trace_id", "", None)}:
            raise ValueError("must be an http(s) URL with {trace_id} where the trace id goes, and no other {...}")
        return value

    @field_validator("webhook_secrets_key")
    @classmethod
    def _sealing_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            webhook_secrets.decode_key(value.get_secret_value())
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _whsec(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        encoded = value.get_secret_value().removeprefix("whsec_")
        try:
            key = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            key = b""
        if not value.get_secret_value().startswith("whsec_") or len(key) < 16:
            raise ValueError("must be whsec_ followed by the base64 of at least 16 random bytes")
        return value
