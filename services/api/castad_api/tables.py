"""The gateway's own tables: requests it accepted and its projection of stage events."""

from __future__ import annotations

import sqlalchemy as sa
from castad_runtime import tables as runtime_tables
from sqlalchemy.dialects import postgresql as pg

metadata = runtime_tables.metadata
TZ = runtime_tables.TZ

pipelines = sa.Table(
    "pipelines",
    metadata,
    sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
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
    sa.Index("pipelines_listing", "created_at", "id"),
)

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
    sa.Column("max_attempts", sa.Integer),
    sa.Column("last_error_code", sa.Text),
    sa.Column("last_error_message", sa.Text),
    sa.Column("next_attempt_at", TZ),
    sa.Column("started_at", TZ),
    sa.Column("finished_at", TZ),
    sa.Column("artifact", pg.JSONB),
)

timeline = sa.Table(
    "pipeline_events",
    metadata,
    sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("pipeline_id", pg.UUID(as_uuid=True), sa.ForeignKey("pipelines.id"), nullable=False),
    sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False, unique=True),
    sa.Column("event_type", sa.Text, nullable=False),
    sa.Column("data", pg.JSONB, nullable=False),
    sa.Column("created_at", TZ, nullable=False, server_default=sa.func.now()),
    sa.Index("pipeline_events_by_pipeline", "pipeline_id", "seq"),
)
