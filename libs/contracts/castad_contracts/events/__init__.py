"""Typed payloads of every event Castad publishes, and their registry: the names every service imports.

Event types are past-tense facts. A payload is self-contained: a consumer never
calls the producer to do its work. Each type carries a schema version; when a
payload changes shape, register a new model under the next version with an upcast
from the previous one (see Registry), so that events still sitting in a queue stay
consumable.

The contract is read as one vocabulary, `events.Stage`, `events.REGISTRY`, `events.SongCompleted`, by over a
hundred modules of every service, library and test; the modules below are how it is kept, a concern each, and this
one names what its readers use (every name in `__all__`, so that mypy's no_implicit_reexport sees it exported):

- common.py: the stages, the pipeline's id, a file, a remake, a share: what every payload is built of;
- lyrics.py: lyrics, their text as a person edits it, and the lines as the song sings them;
- stages.py: what a stage tells of its jobs (started, retrying, failed, completed, canceled, drafted);
- requested.py: what the gateway asks of the stages (a brief to make, a review's decision, an operator's requests);
- names.py: the event types' names, and the saga's order (TRIGGERS);
- older.py: the earlier versions of the events that carry a brief or lyrics;
- registry.py: Registry, and the errors of an event it cannot read;
- versions.py: REGISTRY, every version of every event type in the order they came.
"""

from castad_contracts.events.common import (
    MAX_SHARE_WEIGHT,
    PROVIDER_CALLS,
    STAGE_ORDER,
    Artifact,
    Payload,
    PipelineId,
    Remake,
    Share,
    Stage,
    artifact_place,
    in_stage_place,
)
from castad_contracts.events.lyrics import (
    MAX_LINE_CHARS,
    MAX_LYRICS_CHARS,
    MAX_SECTION_LINES,
    MAX_SECTIONS,
    Lyrics,
    LyricSection,
    TimedLine,
    TimedSyllable,
    lyrics_from_text,
)
from castad_contracts.events.names import (
    DRAFTED,
    OPERATOR_REQUESTS,
    OUTBOX_REPUBLISH_REQUESTED,
    PIPELINE_CANCEL_REQUESTED,
    PIPELINE_REQUESTED,
    PIPELINE_RETRY_REQUESTED,
    PIPELINE_REVIEW_DECIDED,
    TRIGGERS,
    StageFact,
    provider_called_back,
    stage_event,
    stage_facts,
)
from castad_contracts.events.registry import NewerSchemaVersion, Registry, SchemaError, UnknownEventType
from castad_contracts.events.requested import (
    OutboxRepublishRequested,
    PipelineCancelRequested,
    PipelineRequested,
    PipelineRequestedV6,
    PipelineRetryRequested,
    PipelineReviewDecided,
)
from castad_contracts.events.stages import (
    FetchedPhoto,
    LyricCompleted,
    LyricDrafted,
    ProviderCalledBack,
    Render,
    SongCompleted,
    StageCanceled,
    StageCompleted,
    StageFailed,
    StageRetrying,
    StageReviewExpired,
    StageStarted,
    StageStartedV1,
    VideoCompleted,
)
from castad_contracts.events.versions import REGISTRY

__all__ = [
    "DRAFTED",
    "MAX_LINE_CHARS",
    "MAX_LYRICS_CHARS",
    "MAX_SECTIONS",
    "MAX_SECTION_LINES",
    "MAX_SHARE_WEIGHT",
    "OPERATOR_REQUESTS",
    "OUTBOX_REPUBLISH_REQUESTED",
    "PIPELINE_CANCEL_REQUESTED",
    "PIPELINE_REQUESTED",
    "PIPELINE_RETRY_REQUESTED",
    "PIPELINE_REVIEW_DECIDED",
    "PROVIDER_CALLS",
    "REGISTRY",
    "STAGE_ORDER",
    "TRIGGERS",
    "Artifact",
    "FetchedPhoto",
    "LyricCompleted",
    "LyricDrafted",
    "LyricSection",
    "Lyrics",
    "NewerSchemaVersion",
    "OutboxRepublishRequested",
    "Payload",
    "PipelineCancelRequested",
    "PipelineId",
    "PipelineRequested",
    "PipelineRequestedV6",
    "PipelineRetryRequested",
    "PipelineReviewDecided",
    "ProviderCalledBack",
    "Registry",
    "Remake",
    "Render",
    "SchemaError",
    "Share",
    "SongCompleted",
    "Stage",
    "StageCanceled",
    "StageCompleted",
    "StageFact",
    "StageFailed",
    "StageRetrying",
    "StageReviewExpired",
    "StageStarted",
    "StageStartedV1",
    "TimedLine",
    "TimedSyllable",
    "UnknownEventType",
    "VideoCompleted",
    "artifact_place",
    "in_stage_place",
    "lyrics_from_text",
    "provider_called_back",
    "stage_event",
    "stage_facts",
]
