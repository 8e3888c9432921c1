"""The event types' names: what a stage tells of its jobs, what the gateway asks, and the saga's order."""

from __future__ import annotations

import typing
from typing import Literal

from castad_contracts.events.common import STAGE_ORDER, Payload, Stage
from castad_contracts.events.stages import LyricDrafted

PIPELINE_REQUESTED = "pipeline.requested"
PIPELINE_CANCEL_REQUESTED = "pipeline.cancel_requested"
PIPELINE_RETRY_REQUESTED = "pipeline.retry_requested"
OUTBOX_REPUBLISH_REQUESTED = "outbox.republish_requested"
OPERATOR_REQUESTS = (PIPELINE_CANCEL_REQUESTED, PIPELINE_RETRY_REQUESTED, OUTBOX_REPUBLISH_REQUESTED)
PIPELINE_REVIEW_DECIDED = "pipeline.review_decided"
StageFact = Literal["started", "retrying", "completed", "failed", "canceled", "drafted", "review_expired"]
# The stages that draft for a review, and the model of their `drafted` event.
DRAFTED: dict[Stage, type[Payload]] = {Stage.LYRIC: LyricDrafted}
REVIEW_FACTS = ("drafted", "review_expired")  # told only by a stage that drafts


def stage_facts(stage: Stage) -> tuple[StageFact, ...]:
    """What `stage` tells of its jobs."""
    facts: tuple[StageFact, ...] = typing.get_args(StageFact)
    return tuple(fact for fact in facts if stage in DRAFTED or fact not in REVIEW_FACTS)


def stage_event(stage: Stage, fact: StageFact) -> str:
    """The event type by which `stage` tells `fact` about a pipeline's job."""
    return f"{stage.value}.{fact}"


def provider_called_back(stage: Stage) -> str:
    """The event type by which the gateway passes a provider's callback to the stage alone."""
    return f"provider.{stage.value}.called_back"


# The saga's order, written once: the first stage starts on the brief, each later one on its predecessor's result.
TRIGGERS: dict[Stage, str] = {
    stage: PIPELINE_REQUESTED if n == 0 else stage_event(STAGE_ORDER[n - 1], "completed")
    for n, stage in enumerate(STAGE_ORDER)
}
