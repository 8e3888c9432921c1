"""What the gateway asks of a pipeline's stages: a brief to make, a review's decision, an operator's requests."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Literal

from pydantic import Field

from castad_contracts import brief as brief_
from castad_contracts.events.common import REMAKE, SHARE, Payload, Remake, Share, Stage
from castad_contracts.events.lyrics import Lyrics


class PipelineRequestedV6(Payload):
    brief: brief_.Brief
    requested_at: dt.datetime
    max_attempts: dict[Stage, int] | None = Field(
        default=None, description="Per-stage override of the configured maximum attempts."
    )


class PipelineRequested(PipelineRequestedV6):
    review: brief_.Review | None = Field(
        default=None,
        exclude_if=lambda review: review is None,  # as a brief's formats: one without it reads as before reviews
        description="a person decides on the lyrics' draft before the song is made (None: no review)",
    )
    remake: Remake | None = REMAKE
    share: Share | None = SHARE


OPERATION = (
    "number of this operator request among the pipeline's cancels and retries, from 1; every stage applies"
    " them in this order"
)


class PipelineReviewDecided(Payload):
    """A person's decision on a draft, as the gateway recorded it: the stage applies it once, to that draft alone."""

    draft_id: str
    decision: Literal["approve", "edit", "regenerate"]
    lyrics: Lyrics | None = Field(default=None, description="for edit: the final lyrics, sung exactly as written")
    note: brief_.Details | None = Field(default=None, description="for regenerate: what to change, if said")
    decided_by: str = Field(description="the acting key's id; `link` for a notice's link, `timeout` for its timeout")
    decided_at: dt.datetime


class PipelineCancelRequestedV1(Payload):
    reason: str = ""


class PipelineCancelRequested(Payload):
    """Every stage is to stop the pipeline.

    A job not started never starts, a running attempt is stopped, and a stage not reached yet will not start; a
    stage that completed keeps its artifact.
    """

    operation: int = Field(ge=1, description=OPERATION)
    reason: str = Field(max_length=500, description="the operator's words, or deadline_exceeded")


class PipelineRetryRequestedV1(Payload):
    stage: Stage


class PipelineRetryRequested(Payload):
    """A FAILED or CANCELED pipeline resumes at `stage`, the first that did not succeed.

    It gets a fresh attempt budget; stages that succeeded are not run again.
    """

    operation: int = Field(ge=1, description=OPERATION)
    stage: Stage
    max_attempts: dict[Stage, int] | None = Field(
        default=None, description="per-stage attempt budget for this retry (default: each stage's setting)"
    )


class OutboxRepublishRequested(Payload):
    """The service whose outbox holds the parked row with this event id is to hand it back to the relay.

    `pipeline_id` is the row's own.
    """

    event_id: uuid.UUID
