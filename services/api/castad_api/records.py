"""The gateway's rows, typed and frozen, as every module holding an aggregate's statements returns them.

What a caller reads of a pipeline, its stages, attempts and timeline, its dead letters and images: each
a row of its table (or of a statement's columns), its statuses as the model's enums; and the helpers that make
them (`typed`, `columns`, `fields_of`), which those modules share.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any, TypeVar

import sqlalchemy as sa

from castad_api import model

T = TypeVar("T")


def fields_of(cls: type[Any]) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))


def columns(table: sa.Table, cls: type[Any]) -> list[sa.Column[Any]]:
    """The columns of `table` that the typed row `cls` holds, in its order."""
    return [table.c[name] for name in fields_of(cls)]


def typed(cls: type[T], row: Any, **converted: Any) -> T:
    """A typed row from a row of SQL with a column named as each field of `cls`; `converted`: fields made typed."""
    return cls(**{name: getattr(row, name) for name in fields_of(cls)} | converted)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A pipeline's row: the request it was made by and its projection's view of it."""

    id: uuid.UUID
    tenant: str
    idempotency_key: str
    request_hash: str
    brief: dict[str, Any]
    status: model.PipelineStatus
    current_stage: str | None
    progress: int
    error_code: str | None
    error_message: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    operations: int
    cancel_requested_at: dt.datetime | None
    cancel_reason: str | None
    retries: int
    deadline_at: dt.datetime | None
    callback_url: str | None
    trace_id: str | None
    review: dict[str, Any] | None  # brief.Review its request asked for (None: none)
    deadline_paused_at: dt.datetime | None  # its deadline stands still since (a draft waits for a person)
    remake_of: uuid.UUID | None  # the pipeline it remakes (None: not a remake)
    remade_from: str | None  # and the first stage it made again


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage's row of a pipeline, as its events left it."""

    pipeline_id: uuid.UUID
    stage: str
    status: model.StageStatus
    rank: int
    attempt: int
    step: int
    floor_attempt: int
    operation: int
    max_attempts: int | None
    last_error_code: str | None
    last_error_message: str | None
    next_attempt_at: dt.datetime | None
    started_at: dt.datetime | None
    first_started_at: dt.datetime | None
    finished_at: dt.datetime | None
    artifact: dict[str, Any] | None
    fetched_photos: list[dict[str, Any]] | None  # events.FetchedPhoto of each photo named by URL it fetched
    poster: dict[str, Any] | None  # events.Artifact: the video stage's still of its video
    formats: list[dict[str, Any]] | None  # events.Render of each format the video stage made, its artifact's first
    captioned: bool  # its sung lines are kept (the song stage's, once made): its caption files are served


@dataclasses.dataclass(frozen=True)
class Attempt:
    """An attempt of a stage as its events told it."""

    pipeline_id: uuid.UUID
    stage: str
    attempt: int
    worker: str | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    outcome: str | None  # model.AttemptOutcome; None while it runs
    error_code: str | None
    error_message: str | None


@dataclasses.dataclass(frozen=True)
class Entry:
    """A pipeline's timeline entry: `number` among its pipeline's entries, `seq` in the whole gateway."""

    seq: int
    event_type: str
    data: dict[str, Any]
    time: dt.datetime
    number: int


@dataclasses.dataclass(frozen=True)
class Scanned:
    """A timeline entry of any pipeline, as `entries_of_all` scans them.

    `shown`: whether it is the tenant's and matches the filters; only then are its number and its pipeline's
    tenant, customer and region there.
    """

    seq: int
    pipeline_id: uuid.UUID
    event_type: str
    data: dict[str, Any]
    time: dt.datetime
    shown: bool
    number: int | None
    tenant: str | None
    customer_name: str | None
    region: str | None


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A dead letter as recorded, and what operators made of it."""

    id: int
    message_id: str
    kind: str
    service: str | None
    queue: str | None
    reason: str
    event_id: uuid.UUID | None
    event_type: str | None
    schema_version: int | None
    pipeline_id: str | None
    headers: dict[str, Any]
    body: bytes
    body_size: int
    received_at: dt.datetime
    status: str
    replays: int
    updated_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class DeadLetterAction:
    """An operator's action on a dead letter."""

    id: int
    dead_letter_id: int
    action: str
    actor: str
    detail: str
    at: dt.datetime
    key_id: uuid.UUID | None
    key_name: str | None


@dataclasses.dataclass(frozen=True)
class Image:
    """An image a tenant uploaded, kept in the artifact store at `uri`."""

    id: uuid.UUID
    tenant: str
    sha256: str
    media_type: str
    size: int
    width: int
    height: int
    uri: str
    created_at: dt.datetime
    uploaded_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class BrandKit:
    """A tenant's brand kit as last set."""

    tenant: str
    logo: uuid.UUID | None  # an image of the tenant's
    colors: list[str]
    font: str | None
    caption_style: dict[str, Any]
    updated_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class Locked:
    """A pipeline's row as its projection locks it: what recomputing its status, and telling of its end, read."""

    id: uuid.UUID
    status: model.PipelineStatus
    operations: int
    cancel_requested_at: dt.datetime | None
    cancel_reason: str | None
    error_code: str | None
    error_message: str | None
    callback_url: str | None
    tenant: str
    remade_from: str | None = None  # a remake's first stage made again (the ones before reuse their output)


@dataclasses.dataclass(frozen=True)
class StageApplied:
    """A stage's row as the projection reads it.

    What it applied so far (model.Applied), its status, its artifact and its latest start.
    """

    status: model.StageStatus
    rank: int = 0
    attempt: int = 0
    step: int = 0
    floor_attempt: int = 0
    operation: int = 0
    artifact: dict[str, Any] | None = None
    started_at: dt.datetime | None = None

    @property
    def applied(self) -> model.Applied:
        return model.Applied((self.rank, self.attempt, self.step), self.floor_attempt, self.operation)
