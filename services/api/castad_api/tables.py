"""The gateway's own tables: requests it accepted and its projection of stage events."""

from __future__ import annotations

import sqlalchemy as sa
from castad_runtime import tables as runtime_tables
from sqlalchemy.dialects import postgresql as pg

from castad_api import model

metadata = runtime_tables.metadata
TZ = runtime_tables.TZ
# Pipeline statuses no deadline applies to.
OPEN_ENDED = runtime_tables.sql_strings(status for status in model.PipelineStatus if status.terminal)
# Retention's predicates (castad_api.retention), written once for its partial indexes and its queries alike.
ENDED = f"status IN {OPEN_ENDED}"
SETTLED_LETTER = "status IN ('replayed', 'discarded')"
PHOTOS = "photos"  # the key of a brief's photos, present only when it names some

pipelines = sa.Table(
    "pipelines",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
    # Of the key that made it: only that tenant (and admins) see it. `default`: made before keys existed.
    sa.Column("tenant", sa.Text, nullable=False, server_default="default"),
    # The tenant's key, kept as repository.tenant_key() says, so that each tenant has keys of its own.
    sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
    sa.Column("request_hash", sa.Text, nullable=False),
    sa.Column("brief", pg.JSONB, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("current_stage", sa.Text),
    sa.Column("progress", sa.Integer, nullable=False, server_default="0"),
    sa.Column("error_code", sa.Text),
    sa.Column("error_message", sa.Text),
    sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("finished_at", TZ),
    # Operator requests: how many were made (they are numbered), the pending cancel, retries so far.
    sa.Column("operations", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cancel_requested_at", TZ),
    sa.Column("cancel_reason", sa.Text),
    sa.Column("retries", sa.Integer, nullable=False, server_default="0"),
    # Cancelled with deadline_exceeded if not ended by then (reset by a retry).
    sa.Column("deadline_at", TZ),
    # Where to tell of the pipeline's end (webhooks.py); not part of the brief the stages get.
    sa.Column("callback_url", sa.Text),
    # Of the traceparent of its pipeline.requested: one trace per pipeline (null: no tracing then).
    sa.Column("trace_id", sa.Text),
    # The review its request asked for (brief.Review; null: none), and since when its deadline stands still while
    # a draft waits for a person (null: it runs).
    sa.Column("review", pg.JSONB),
    sa.Column("deadline_paused_at", TZ),
    # A remake: the pipeline it remakes, and the first stage it made again (the ones before reused their output).
    sa.Column("remake_of", pg.UUID(as_uuid=True)),
    sa.Column("remade_from", sa.Text),
    sa.Index("pipelines_listing", "created_at", "id"),
    sa.Index("pipelines_tenant_listing", "tenant", "created_at", "id"),
    sa.Index("pipelines_due", "deadline_at", postgresql_where=sa.text(f"status NOT IN {OPEN_ENDED}")),
    sa.Index("pipelines_ended", "finished_at", postgresql_where=sa.text(ENDED)),
    # The statistics (stats.py) read only what is in flight, or ended within their window (pipelines_ended).
    sa.Index("pipelines_in_flight", "status", postgresql_where=sa.text(f"status NOT IN {OPEN_ENDED}")),
    sa.Index("pipelines_remakes", "remake_of", postgresql_where=sa.text("remake_of IS NOT NULL")),
)
# A part of a customer's name, found by its trigrams (pg_trgm; every script, Hangul too).
sa.Index(
    "pipelines_customer_name",
    pipelines.c.brief["customer_name"].astext.label("customer_name"),
    postgresql_using="gin",
    postgresql_ops={"customer_name": "gin_trgm_ops"},
)

# The index of customer names needs pg_trgm, a trusted extension: the database's owner may create it.
# (SQLAlchemy's DDL is untyped.)
EXTENSIONS = sa.DDL("CREATE EXTENSION IF NOT EXISTS pg_trgm")  # type: ignore[no-untyped-call]
sa.event.listen(pipelines, "before_create", EXTENSIONS)

stages = sa.Table(
    "pipeline_stages",
    metadata,
    sa.Column("pipeline_id", pg.UUID(as_uuid=True), sa.ForeignKey("pipelines.id"), primary_key=True),
    sa.Column("stage", sa.Text, primary_key=True),
    sa.Column("status", sa.Text, nullable=False),
    # Position of the last applied event: (rank, attempt, step). Only a later one is applied.
    sa.Column("rank", sa.Integer, nullable=False, server_default="0"),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("step", sa.Integer, nullable=False, server_default="0"),
    # A retry makes the events of the attempts before it stale: those up to this attempt number.
    sa.Column("floor_attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("operation", sa.Integer, nullable=False, server_default="0"),  # the last cancel applied
    sa.Column("max_attempts", sa.Integer),
    sa.Column("last_error_code", sa.Text),
    sa.Column("last_error_message", sa.Text),
    sa.Column("next_attempt_at", TZ),
    sa.Column("started_at", TZ),  # of its latest attempt
    sa.Column("first_started_at", TZ),  # of its first attempt since it was (re)opened
    sa.Column("finished_at", TZ),
    sa.Column("artifact", pg.JSONB),
    # The photos named by URL that the stage fetched and kept (events.FetchedPhoto, as JSON), with its artifact.
    sa.Column("fetched_photos", pg.JSONB),
    # The song stage's sung lines (events.TimedLine, as JSON), with its artifact: its caption files (captions.py).
    sa.Column("sung_lines", pg.JSONB),
    # The video stage's poster (events.Artifact, as JSON), a file of the stage as its artifact is.
    sa.Column("poster", pg.JSONB),
    # The video stage's formats (events.Render, as JSON; the first its artifact), files of the stage as that one is.
    sa.Column("formats", pg.JSONB),
    sa.Index("pipeline_stages_finished", "finished_at", postgresql_where=sa.text("finished_at IS NOT NULL")),
)

# Every attempt of a stage as its events told it: who ran it, when, how it ended (projection.py).
attempts = sa.Table(
    "pipeline_attempts",
    metadata,
    sa.Column(
        "pipeline_id", pg.UUID(as_uuid=True), sa.ForeignKey("pipelines.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("stage", sa.Text, primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True),
    sa.Column("worker", sa.Text),  # null: its started event did not say (version 1) or has not come
    sa.Column("started_at", TZ),
    sa.Column("ended_at", TZ),
    sa.Column("outcome", sa.Text),  # null while it runs; model.AttemptOutcome
    sa.Column("error_code", sa.Text),
    sa.Column("error_message", sa.Text),
    sa.Index(
        "pipeline_attempts_ended",
        "ended_at",
        postgresql_include=["stage", "outcome", "error_code", "started_at"],
        postgresql_where=sa.text("ended_at IS NOT NULL"),
    ),
)

# Who may call the gateway (keys.py): only a key's SHA-256 is kept.
api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("scopes", pg.ARRAY(sa.Text), nullable=False),
    sa.Column("digest", sa.Text, nullable=False, unique=True),
    sa.Column("shown", sa.Text, nullable=False),  # the key's first characters, to tell keys apart
    sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("revoked_at", TZ),
)

# Pipelines created per key and minute, for the creation limit every gateway replica shares.
key_windows = sa.Table(
    "api_key_windows",
    metadata,
    sa.Column("key_id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("window_start", TZ, primary_key=True),
    sa.Column("count", sa.Integer, nullable=False),
)

timeline = sa.Table(
    "pipeline_events",
    metadata,
    sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("pipeline_id", pg.UUID(as_uuid=True), sa.ForeignKey("pipelines.id"), nullable=False),
    sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False, unique=True),
    sa.Column("event_type", sa.Text, nullable=False),
    sa.Column("data", pg.JSONB, nullable=False),
    sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),  # when the gateway wrote it
    sa.Column("occurred_at", TZ),  # the event's own time (its envelope's); null: written before it was kept
    sa.Index("pipeline_events_by_pipeline", "pipeline_id", "seq"),
    sa.Index("pipeline_events_created", "created_at"),
)

dead_letters = sa.Table(
    "dead_letters",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("message_id", sa.Text, nullable=False, unique=True),  # of the dead-letter message: recorded once
    sa.Column("kind", sa.Text, nullable=False),  # message: a queue could not handle it; parked: an outbox row
    sa.Column("service", sa.Text),
    sa.Column("queue", sa.Text),  # the queue it came from (a replay goes back there)
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("event_id", pg.UUID(as_uuid=True)),
    sa.Column("event_type", sa.Text),
    sa.Column("schema_version", sa.Integer),
    sa.Column("pipeline_id", sa.Text),
    sa.Column("headers", pg.JSONB, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),  # as received, up to the size cap
    sa.Column("body_size", sa.Integer, nullable=False),  # as received
    sa.Column("received_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("status", sa.Text, nullable=False, server_default="dead"),  # dead, replayed, discarded
    sa.Column("replays", sa.Integer, nullable=False, server_default="0"),
    sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Index("dead_letters_by_status", "status", "id"),
    sa.Index("dead_letters_by_pipeline", "pipeline_id", "id"),
    sa.Index("dead_letters_open", "kind", postgresql_where=sa.text("status = 'dead'")),
    sa.Index("dead_letters_received", "received_at"),
    sa.Index("dead_letters_settled", "updated_at", postgresql_where=sa.text(SETTLED_LETTER)),
)

dead_letter_actions = sa.Table(
    "dead_letter_actions",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("dead_letter_id", sa.BigInteger, sa.ForeignKey("dead_letters.id"), nullable=False),
    sa.Column("action", sa.Text, nullable=False),  # replay, discard
    sa.Column("actor", sa.Text, nullable=False),
    sa.Column("detail", sa.Text, nullable=False),  # what was done, or the reason given
    sa.Column("at", TZ, nullable=False, server_default=sa.func.now()),
    # The API key that acted, as it was then (null: recorded before keys were), besides the actor it named.
    sa.Column("key_id", pg.UUID(as_uuid=True)),
    sa.Column("key_name", sa.Text),
    sa.Index("dead_letter_actions_by_letter", "dead_letter_id", "id"),
)

# Keys the gateway makes for itself, the same for every replica (keyring.py).
gateway_keys = sa.Table(
    "gateway_keys",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("secret", sa.LargeBinary, nullable=False),
    sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
)

# Notices to a brief's callback_url when its pipeline ends, delivered by the gateway itself (webhook_deliverer.py).
webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),  # the webhook-id header: the same on every try
    sa.Column("pipeline_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("url", sa.Text, nullable=False),
    # The URL's receiving host (webhook_slots.host), whose places it takes; null when made before migration 0015.
    sa.Column("host", sa.Text),
    sa.Column("event_type", sa.Text, nullable=False),
    sa.Column("payload", pg.JSONB, nullable=False),
    sa.Column("status", sa.Text, nullable=False, server_default="pending"),  # pending, delivered, failed
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("due_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("last_error", sa.Text),
    sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("finished_at", TZ),
    sa.Index("webhook_deliveries_due", "due_at", postgresql_where=sa.text("status = 'pending'")),
    sa.Index("webhook_deliveries_by_pipeline", "pipeline_id", "created_at"),
)

# Each tenant's Standard Webhooks secrets, sealed (webhook_secrets.py): valid until expires_at (null: until rotated).
webhook_secrets = sa.Table(
    "webhook_secrets",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("sealed", sa.LargeBinary, nullable=False),  # AES-256-GCM: nonce, then ciphertext and tag
    sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("expires_at", TZ),
    sa.Index("webhook_secrets_by_tenant", "tenant", "created_at"),
)

webhook_attempts = sa.Table(
    "webhook_attempts",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("delivery_id", pg.UUID(as_uuid=True), sa.ForeignKey("webhook_deliveries.id"), nullable=False),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("started_at", TZ, nullable=False),
    sa.Column("duration_ms", sa.Integer, nullable=False),
    sa.Column("status_code", sa.Integer),
    sa.Column("error", sa.Text),
    sa.UniqueConstraint("delivery_id", "number"),
)

# Pipelines whose brief names uploaded photos, found by an image's id (`brief->'photos' @> [{"id": ...}]`):
# retention keeps an image while a pipeline names it (castad_api.image_retention).
PHOTOS_OF = pipelines.c.brief.op("->")(sa.literal_column(f"'{PHOTOS}'"))  # `brief -> 'photos'`, as indexed
sa.Index(
    "pipelines_photos",
    PHOTOS_OF.label("photos"),
    postgresql_using="gin",
    postgresql_ops={"photos": "jsonb_path_ops"},
    postgresql_where=sa.text(f"brief ? '{PHOTOS}'"),
)

# Pipelines whose brief's brand shows a logo, found by the logo's image id: retention keeps it as it keeps photos.
LOGO_OF = pipelines.c.brief.op("#>>")(sa.literal_column("'{brand,logo,id}'"))  # `brief #>> '{brand,logo,id}'`
sa.Index("pipelines_brand_logo", LOGO_OF.label("logo"), postgresql_where=sa.text("brief ? 'brand'"))

# Each tenant's brand kit (routes/brand.py): every brief of the tenant uses it as it is when the pipeline is made.
# Its logo is an image of the tenant's, which retention keeps while the kit shows it.
brand_kits = sa.Table(
    "brand_kits",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("logo", pg.UUID(as_uuid=True)),
    sa.Column("colors", pg.JSONB, nullable=False),
    sa.Column("font", sa.Text),
    sa.Column("caption_style", pg.JSONB, nullable=False),
    sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("updated_by", pg.UUID(as_uuid=True)),  # the API key that set it
    sa.Index("brand_kits_logo", "logo", postgresql_where=sa.text("logo IS NOT NULL")),
)

# Images a tenant uploaded (routes/images.py), each kept once in the artifact store under its owner's place, named
# by its bytes (`uri`): the same bytes uploaded again by the same tenant are the same image, and its file is that
# row's alone. `uploaded_at` is its last upload: retention deletes it some time after, once no pipeline or brand kit
# names it.
images = sa.Table(
    "images",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("sha256", sa.Text, nullable=False),
    sa.Column("media_type", sa.Text, nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("width", sa.Integer, nullable=False),
    sa.Column("height", sa.Integer, nullable=False),
    sa.Column("uri", sa.Text, nullable=False),
    sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Column("uploaded_at", TZ, nullable=False, server_default=sa.func.now()),
    # Set while an upload keeps its file (found once kept), and once retention chose to delete it (found no more).
    sa.Column("keeping_since", TZ),
    sa.Column("deleting_since", TZ),
    sa.UniqueConstraint("tenant", "sha256", name="images_tenant_sha256"),
    sa.Index("images_uploaded", "uploaded_at"),
)

# Each tenant's uploads as a token bucket (upload_limits.py): `tokens` left at `at`, refilled at the configured rate
# up to the burst. A tenant without a row has a full bucket.
upload_buckets = sa.Table(
    "image_upload_buckets",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("tokens", sa.Float, nullable=False),
    sa.Column("at", TZ, nullable=False),
)

# Each draft a stage made for a person to decide on (`<stage>.drafted`), and what became of it: a key's decision, or
# its timeout (`<stage>.review_expired`). A pipeline's current draft is its latest round's.
pipeline_reviews = sa.Table(
    "pipeline_reviews",
    metadata,
    sa.Column("draft_id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("pipeline_id", pg.UUID(as_uuid=True), sa.ForeignKey("pipelines.id", ondelete="CASCADE"), nullable=False),
    sa.Column("stage", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("lyrics", pg.JSONB, nullable=False),  # events.Lyrics, as drafted
    sa.Column("review_until", TZ, nullable=False),
    sa.Column("on_timeout", sa.Text, nullable=False),
    sa.Column("drafted_at", TZ, nullable=False),
    # approve, edit or regenerate by a key or a link; approve or cancel by its timeout (null: not settled yet)
    sa.Column("decision", sa.Text),
    sa.Column("edited", pg.JSONB),  # events.Lyrics of an edit
    sa.Column("note", sa.Text),  # what a regenerate asked to change
    sa.Column("decided_by", pg.UUID(as_uuid=True)),  # the acting key (null: a link, or the timeout)
    sa.Column("decided_at", TZ),
    sa.Column("expired_at", TZ),  # when its stage said it timed out (the gateway settles it: reviews.py)
    sa.Index("pipeline_reviews_by_pipeline", "pipeline_id", "round"),
    # Drafts not settled yet: those waiting, and those timed out until the gateway settles them.
    sa.Index("pipeline_reviews_open", "review_until", postgresql_where=sa.text("decision IS NULL")),
)

# Each tenant's settings an operator made (castad-admin tenants): its weight in the stages' fair turns. A tenant
# without a row has weight 1.
tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("weight", sa.Integer, nullable=False, server_default="1"),
    sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.CheckConstraint("weight BETWEEN 1 AND 100", name="tenants_weight"),  # events.MAX_SHARE_WEIGHT
)

# A tenant's budget for each UTC day or month (usage.py): at most so many pipelines, seconds of song and estimated
# cost (null: no limit on it). A brief past one is refused when it is made; work accepted before goes on.
budgets = sa.Table(
    "budgets",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("period", sa.Text, primary_key=True),  # day or month
    sa.Column("pipelines", sa.Integer),
    sa.Column("song_seconds", sa.Float),
    sa.Column("cost", sa.Float),
    sa.Column("updated_at", TZ, nullable=False, server_default=sa.func.now()),
)

# What each tenant used each UTC day, by meter (api.Meter): pipelines made, requests for work sent to each stage's
# provider, seconds of song and video made, bytes of files kept. Added to by the projection from the stages' events
# (each applied once) and by each creation.
usage = sa.Table(
    "usage",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("meter", sa.Text, primary_key=True),
    # Each transaction adds to rows of one shard of the 16 (usage.SHARDS), so that two do not wait for each other.
    sa.Column("shard", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("amount", sa.Float, nullable=False),
    sa.Index("usage_by_day", "day"),
)
