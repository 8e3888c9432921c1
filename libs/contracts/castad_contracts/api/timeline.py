"""A pipeline's timeline: its entries, attempts and operators' actions; the stream of every pipeline's entries."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, Field

from castad_contracts import events
from castad_contracts.api.common import Links
from castad_contracts.api.files import ArtifactLink


class ErrorInfo(BaseModel):
    code: str
    message: str


class TimelineEntry(BaseModel):
    """One entry of a pipeline's timeline: a stage's event, an operator's action, a dead letter about it."""

    seq: int = Field(
        description="its number among its pipeline's entries (1, 2, ...): where its timeline's `after` and its"
        " pipeline's event stream (Last-Event-ID) resume"
    )
    time: dt.datetime = Field(description="when it happened: the event's own time")
    event_type: str = Field(description="e.g. song.retrying, pipeline.cancel_requested, dead_letter.replayed")
    step: str = Field(description="lyric, song, video, or pipeline for what concerns the whole pipeline")
    status: str = Field(
        description="what happened: requested, started, retrying, drafted, review_decided, review_expired, completed,"
        " failed, canceled, cancel_requested, retry_requested, dead_letter_recorded, dead_letter_replayed,"
        " dead_letter_discarded"
    )
    pipeline_status: str = Field(description="the pipeline's status after it")
    progress: int = Field(ge=0, le=100, description="the pipeline's progress after it, in percent")
    attempt: int | None = Field(default=None, description="the stage's attempt it is about")
    worker: str | None = Field(
        default=None, description="started: the worker that runs the attempt (to a tenant: an opaque id)"
    )
    error: ErrorInfo | None = Field(default=None, description="its code, and to a tenant the code's public message")
    next_attempt_at: dt.datetime | None = Field(default=None, description="retrying: when the next attempt is due")
    max_attempts: int | None = Field(default=None, description="retrying: the number of the last attempt that may run")
    attempt_budgets: dict[events.Stage, int] | None = Field(
        default=None, description="retry_requested: the attempt budgets the operator gave"
    )
    actor: str | None = Field(default=None, description="an operator's action: who acted (its X-Castad-Actor)")
    actor_key_id: str | None = Field(
        default=None, description="an operator's action: the API key that acted (shown to a tenant for its own keys)"
    )
    actor_key_name: str | None = Field(default=None, description="an operator's action: that key's name")
    reason: str | None = Field(default=None, description="a cancel's reason, or a dead letter's")
    operation: int | None = Field(default=None, description="the number of an operator's cancel or retry")
    resume: events.Stage | None = Field(default=None, description="retry_requested: the stage that runs again")
    dead_letter: int | None = Field(default=None, description="the dead letter it is about")
    detail: str | None = Field(default=None, description="what was done with a dead letter")
    artifact: ArtifactLink | None = Field(default=None, description="completed: the stage's file")
    artifacts: dict[events.Stage, ArtifactLink] | None = Field(
        default=None, description="on the pipeline's end: every file it has"
    )
    draft: dict[str, Any] | None = Field(
        default=None,
        description="drafted: the draft for review (id, round, text, review_until, on_timeout); review_decided: the"
        " decision (id, decision, note); review_expired: the draft that timed out (id, on_timeout)",
    )


class AttemptView(BaseModel):
    """An attempt of a stage as its events told the gateway."""

    stage: events.Stage
    attempt: int
    worker: str | None = Field(
        description="who ran it (to a tenant: an opaque id, the same for one worker within the pipeline); null if"
        " its start did not say or has not been heard of"
    )
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    duration_s: float | None = Field(description="from its start to its end; null until both are known")
    outcome: str = Field(
        description="running; succeeded; failed_retryable (the work failed, the stage tries again); failed (for"
        " good); interrupted (the machinery lost it: a worker stopped or died, an outage; not counted); canceled"
    )
    error_code: str | None
    error_message: str | None = Field(description="to a tenant: its code's public message")


class OperatorAction(BaseModel):
    """What an operator (or the deadline) did to the pipeline, from its timeline."""

    seq: int
    time: dt.datetime
    action: str = Field(description="cancel_requested, retry_requested, dead_letter_replayed, dead_letter_discarded")
    actor: str | None = Field(description="who acted (`deadline` for a cancel the deadline made)")
    actor_key_id: str | None = Field(default=None, description="the API key that acted (a tenant's: its own only)")
    actor_key_name: str | None = Field(default=None, description="that key's name")
    reason: str | None
    operation: int | None
    resume: events.Stage | None
    dead_letter: int | None
    detail: str | None


class PipelineTimeline(BaseModel):
    """Everything that happened to a pipeline, in order, with its attempts and the operators' actions."""

    id: str
    status: str
    trace_id: str | None = Field(description="the pipeline's trace (W3C trace id); null if none was recorded")
    trace_url: str | None = Field(description="the trace in a trace viewer (CASTAD_API_TRACE_URL); null: none set")
    entries: list[TimelineEntry] = Field(
        description="by the time each happened (seq breaks ties); a page holds the entries of the lowest seqs"
    )
    next_after: int | None = Field(
        description="more entries follow: pass as `after` for the next ones (the page's highest seq); null when"
        " these are the last"
    )
    attempts: list[AttemptView] = Field(description="every attempt of every stage, by stage order and number")
    actions: list[OperatorAction] = Field(description="the operators' actions among these entries")
    links: Links


class FirehoseEntry(TimelineEntry):
    """A timeline entry on the stream of every pipeline, with what a board shows of its pipeline.

    Its event's id (Last-Event-ID) is a cursor of that stream: to an admin key, the entry's place among every entry
    of the gateway; to a tenant's, an opaque one that counts nothing.
    """

    pipeline_id: str
    tenant: str
    customer_name: str
    region: str
