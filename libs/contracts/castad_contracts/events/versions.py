"""Every version of every event type, in the order they came, with how each reads the one before (REGISTRY)."""

from __future__ import annotations

from typing import Any

from castad_contracts.events import older, requested, stages
from castad_contracts.events.common import STAGE_ORDER, Payload, Stage, in_stage_place
from castad_contracts.events.names import (
    OUTBOX_REPUBLISH_REQUESTED,
    PIPELINE_CANCEL_REQUESTED,
    PIPELINE_REQUESTED,
    PIPELINE_RETRY_REQUESTED,
    PIPELINE_REVIEW_DECIDED,
    StageFact,
    provider_called_back,
    stage_event,
)
from castad_contracts.events.registry import Registry


def _same(data: dict[str, Any]) -> dict[str, Any]:
    """The upcast of a version whose every payload is valid in the next as it is."""
    return data


_COMPLETED_V2: dict[Stage, type[Payload]] = {
    Stage.LYRIC: older.LyricCompletedV2,
    Stage.SONG: stages.SongCompletedV2,
    Stage.VIDEO: older.VideoCompletedV2,
}
_COMPLETED_V4: dict[Stage, type[Payload]] = {
    Stage.LYRIC: older.LyricCompletedV4,
    Stage.SONG: older.SongCompletedV5,
    Stage.VIDEO: stages.VideoCompletedV4,
}
_COMPLETED_V1: dict[Stage, type[Payload]] = {
    Stage.LYRIC: older.LyricCompletedV1,
    Stage.SONG: older.SongCompletedV1,
    Stage.VIDEO: older.VideoCompletedV1,
}


def _kept_in_stage_place(payload: Any) -> bool:
    """Whether a completed event names a file its stage kept in its own place.

    The layout from lyric v6, song and video v7, whose files a release before would refuse as another's.
    """
    files = (payload.artifact, *(fetched.file for fetched in getattr(payload, "fetched_photos", ())))
    files += (payload.poster,) if getattr(payload, "poster", None) else ()
    return any(in_stage_place(file.uri, payload.pipeline_id, payload.stage) for file in files)


def _remade(payload: Any) -> bool:
    """Whether a completed event is of a remake (its `remake` is passed on)."""
    return payload.remake is not None


def _shared_or_metered(payload: Any) -> bool:
    """Whether an event tells whose work it is (`share`), or what its attempt asked of its provider or made."""
    return any(getattr(payload, field, None) is not None for field in ("share", "provider_calls", "duration_s"))


REGISTRY = Registry()
REGISTRY.register(PIPELINE_REQUESTED, 1, older.PipelineRequestedV1)
REGISTRY.register(PIPELINE_REQUESTED, 2, older.PipelineRequestedV2, _same)
REGISTRY.register(PIPELINE_REQUESTED, 3, older.PipelineRequestedV3, _same)
REGISTRY.register(PIPELINE_REQUESTED, 4, older.PipelineRequestedV4, _same)
REGISTRY.register(PIPELINE_REQUESTED, 5, older.PipelineRequestedV5, _same)
# Version 1 of the operator requests had no order; read as the first request of their pipeline.
REGISTRY.register(PIPELINE_CANCEL_REQUESTED, 1, requested.PipelineCancelRequestedV1)
REGISTRY.register(
    PIPELINE_CANCEL_REQUESTED,
    2,
    requested.PipelineCancelRequested,
    lambda data: {**data, "operation": 1, "reason": data["reason"][:500] or "canceled"},
)
REGISTRY.register(PIPELINE_RETRY_REQUESTED, 1, requested.PipelineRetryRequestedV1)
REGISTRY.register(PIPELINE_RETRY_REQUESTED, 2, requested.PipelineRetryRequested, lambda data: {**data, "operation": 1})
REGISTRY.register(OUTBOX_REPUBLISH_REQUESTED, 1, requested.OutboxRepublishRequested)
for _stage in Stage:
    REGISTRY.register(stage_event(_stage, "started"), 1, stages.StageStartedV1)
    REGISTRY.register(stage_event(_stage, "started"), 2, stages.StageStarted, lambda data: {**data, "worker": None})
    REGISTRY.register(stage_event(_stage, "retrying"), 1, stages.StageRetrying)
    REGISTRY.register(stage_event(_stage, "completed"), 1, _COMPLETED_V1[_stage])
    REGISTRY.register(stage_event(_stage, "completed"), 2, _COMPLETED_V2[_stage], _same)
    REGISTRY.register(stage_event(_stage, "failed"), 1, stages.StageFailed)
    REGISTRY.register(stage_event(_stage, "canceled"), 1, stages.StageCanceled)
    REGISTRY.register(provider_called_back(_stage), 1, stages.ProviderCalledBack)
# Version 3 of song.completed times every syllable; a version-2 line reads as one whose syllables are untold.
REGISTRY.register(stage_event(Stage.SONG, "completed"), 3, stages.SongCompletedV3, _same)
# Then every completed event names the brief's photos (lyric and video v3, song v4); an older one names none.
_COMPLETED_V3: dict[Stage, type[Payload]] = {
    Stage.LYRIC: older.LyricCompletedV3,
    Stage.SONG: stages.SongCompletedV4,
    Stage.VIDEO: older.VideoCompletedV3,
}
for _stage, _version in ((Stage.LYRIC, 3), (Stage.SONG, 4), (Stage.VIDEO, 3)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED_V3[_stage], _same)
# Then a brief may name photos by URL (lyric and video v4, song v5), and song.completed tells the song's bars; an
# older event names uploads only and tells no bars.
for _stage, _version in ((Stage.LYRIC, 4), (Stage.SONG, 5), (Stage.VIDEO, 4)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED_V4[_stage], _same)
# Then video.completed (v5) tells the photos named by URL that the stage fetched and kept; an older one tells none.
REGISTRY.register(
    stage_event(Stage.VIDEO, "completed"), 5, stages.VideoCompletedV5, lambda data: {**data, "fetched_photos": []}
)
# Then the brief's uploaded photos carry the gateway's seal (pipeline.requested v5 above, lyric v5, song v6, video v6);
# an older event's carry none.
_COMPLETED_V5: dict[Stage, type[Payload]] = {
    Stage.LYRIC: older.LyricCompletedV6,
    Stage.SONG: older.SongCompletedV7,
    Stage.VIDEO: stages.VideoCompletedV7,
}
for _stage, _version in ((Stage.LYRIC, 5), (Stage.SONG, 6), (Stage.VIDEO, 6)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED_V5[_stage], _same)
# Then each stage keeps its files in its own place (lyric v6, song v7, video v7; `artifact_place`): the same shape,
# but a release before refuses such a file as another's, so an event naming one is written as this version at least.
for _stage, _version in ((Stage.LYRIC, 6), (Stage.SONG, 7), (Stage.VIDEO, 7)):
    REGISTRY.register(
        stage_event(_stage, "completed"), _version, _COMPLETED_V5[_stage], _same, needed=_kept_in_stage_place
    )
# Then video.completed (v8) names the video's poster; an older one names none.
REGISTRY.register(
    stage_event(Stage.VIDEO, "completed"), 8, stages.VideoCompletedV8, lambda data: {**data, "poster": None}
)
# Then a brief may ask for several formats (pipeline.requested v6, lyric v7, song v8), and video.completed (v9) names
# each one's video and poster; an older event's brief asks for its orientation's format alone.
REGISTRY.register(PIPELINE_REQUESTED, 6, requested.PipelineRequestedV6, _same)
_COMPLETED: dict[Stage, type[Payload]] = {
    Stage.LYRIC: stages.LyricCompleted,
    Stage.SONG: stages.SongCompleted,
    Stage.VIDEO: stages.VideoCompleted,
}
for _stage, _version in ((Stage.LYRIC, 7), (Stage.SONG, 8), (Stage.VIDEO, 9)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED[_stage], _same)
# Then a pipeline may ask for a review of its lyrics (pipeline.requested v7): the lyric stage drafts, a person decides
# (pipeline.review_decided), and the stage goes on; an older pipeline.requested asks for none.
REGISTRY.register(PIPELINE_REQUESTED, 7, requested.PipelineRequested, _same)
REGISTRY.register(stage_event(Stage.LYRIC, "drafted"), 1, stages.LyricDrafted)
REGISTRY.register(stage_event(Stage.LYRIC, "review_expired"), 1, stages.StageReviewExpired)
REGISTRY.register(PIPELINE_REVIEW_DECIDED, 1, requested.PipelineReviewDecided)
# Then a pipeline may remake another from one of its stages on (pipeline.requested v7 above, lyric v8, song v9): the
# stages before it reuse their output of the other; an event of a pipeline that is not a remake is written as before.
for _stage, _version in ((Stage.LYRIC, 8), (Stage.SONG, 9)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED[_stage], _same, needed=_remade)
# Then the stages take their turns fairly across tenants (pipeline.requested v8 tells whose work a pipeline is, lyric
# v9 and song v10 pass it on), and every event that ends an attempt tells the requests for work it sent its provider
# (lyric v9, song v10, video v10; retrying, failed and canceled v2; lyric.drafted v2), which the gateway meters. An
# event with neither is written as before.
REGISTRY.register(PIPELINE_REQUESTED, 8, requested.PipelineRequested, _same, needed=_shared_or_metered)
for _stage, _version in ((Stage.LYRIC, 9), (Stage.SONG, 10), (Stage.VIDEO, 10)):
    REGISTRY.register(stage_event(_stage, "completed"), _version, _COMPLETED[_stage], _same, needed=_shared_or_metered)
_ENDS: tuple[tuple[StageFact, type[Payload]], ...] = (
    ("retrying", stages.StageRetrying),
    ("failed", stages.StageFailed),
    ("canceled", stages.StageCanceled),
)
for _stage in STAGE_ORDER:
    for _fact, _model in _ENDS:
        REGISTRY.register(stage_event(_stage, _fact), 2, _model, _same, needed=_shared_or_metered)
REGISTRY.register(stage_event(Stage.LYRIC, "drafted"), 2, stages.LyricDrafted, _same, needed=_shared_or_metered)
