"""A person's decision on a pipeline's draft, and a draft whose review timed out, carried to its stage.

Each is recorded with the event that tells the stage (`pipeline.review_decided`), or, a review timed out with
`on_timeout` cancel, is a cancel (operations.py); each is an entry of the pipeline's timeline.
"""

from __future__ import annotations

import datetime as dt
import uuid

import sqlalchemy as sa
from castad_contracts import api, brief, codes, events
from castad_runtime import outbox

from castad_api import errors, model, operations, projection, repository, reviews


def decide(
    conn: sa.Connection,
    pipeline_id: uuid.UUID,
    body: api.ReviewDecision,
    tenant: str | None,
    key: dict[str, str] | None,
) -> model.PipelineStatus:
    """Record a decision on the pipeline's current draft and carry it to the stage; the pipeline's status.

    Of `tenant`'s pipeline, if given; by the API key `key` (keys.Principal.acting; None: a signed link). NotFound,
    a Conflict for any draft but the current one, one decided or timed out, a pipeline that no longer waits, or a
    regenerate past the limit; InvalidField for lyrics that break the stage's limits.
    """
    pipeline = repository.lock_pipeline(conn, pipeline_id, tenant)
    if pipeline is None:
        raise errors.NotFound(f"no pipeline {pipeline_id}")
    status = model.PipelineStatus(pipeline.status)
    draft = reviews.current(conn, [pipeline_id]).get(pipeline_id)
    if draft is None or str(draft.draft_id) != body.draft:
        now = f"its current draft is {draft.draft_id}" if draft else "it has no draft yet"
        raise errors.Conflict(f"draft {body.draft} is not pipeline {pipeline_id}'s current draft: {now}", status.value)
    if not draft.open:
        came = f"{draft.decision} ({'its timeout' if draft.decided_by is None else 'by a key'})"
        raise errors.Conflict(f"draft {body.draft} was already decided: {came}", status.value)
    if repository.now(conn) > draft.review_until:
        raise errors.Conflict(
            f"draft {body.draft}'s review timed out at {draft.review_until.isoformat()}: it comes to"
            f" {draft.on_timeout}",
            status.value,
        )
    if status is not model.PipelineStatus.AWAITING_REVIEW:
        raise errors.Conflict(f"pipeline {pipeline_id} is {status.value}, not waiting for a review", status.value)
    if body.decision == "regenerate" and draft.round >= brief.MAX_REGENERATIONS:
        raise errors.Conflict(
            f"draft {body.draft} is the last new draft a review may ask for ({brief.MAX_REGENERATIONS}): approve or"
            " edit it",
            status.value,
        )
    edited = None
    if body.decision == "edit":
        assert body.lyrics is not None  # the model's: an edit gives lyrics
        language = brief.Language(events.Lyrics.model_validate(draft.lyrics).language)
        try:
            edited = events.lyrics_from_text(body.lyrics, language)
        except ValueError as error:
            raise errors.InvalidField(("body", "lyrics"), f"the lyrics {error}") from None
    key_id = uuid.UUID(key["id"]) if key else None
    decided = events.PipelineReviewDecided(
        pipeline_id=str(pipeline_id),
        draft_id=body.draft,
        decision=body.decision,
        lyrics=edited,
        note=body.note,
        decided_by=str(key_id) if key_id else reviews.BY_LINK,
        decided_at=dt.datetime.now(dt.UTC),
    )
    if not reviews.decided(conn, draft, body.decision, decided.decided_at, key_id, edited, body.note):
        raise errors.Conflict(f"draft {body.draft} was settled meanwhile (its review timed out)", status.value)
    env = outbox.add(conn, decided, events.PIPELINE_REVIEW_DECIDED, operations.SOURCE)
    stage = events.Stage(draft.stage)
    if body.decision == "regenerate":  # its attempt ends here; the stage makes the next draft on a new one
        ended = {"ended_at": decided.decided_at, "outcome": model.AttemptOutcome.REDRAFTED.value}
        repository.save_attempt(conn, pipeline_id, stage, draft.attempt, ended)
    return projection.record(
        conn,
        pipeline,
        env.id,
        env.type,
        stage,
        "review_decided",
        occurred_at=env.time,
        draft={"id": body.draft, "decision": body.decision, "note": body.note},
        actor="signed link" if key is None else "key",
        **operations.acting(key),
    )


def settle_timed_out(conn: sa.Connection, limit: int = 100) -> int:
    """Settle the drafts whose review timed out with no decision taken; how many.

    As each one's `on_timeout` says: the draft's approval sent to its stage, or the pipeline canceled
    (review_timeout). A draft of a pipeline that no longer waits (canceled meanwhile) is only marked settled.
    """
    due = reviews.due(conn, limit)
    for draft in due:
        pipeline = repository.lock_pipeline(conn, draft.pipeline_id)  # first, as a decision locks it
        waits = pipeline is not None and pipeline.status is model.PipelineStatus.AWAITING_REVIEW
        settled = reviews.CANCELED if not waits or draft.on_timeout == "cancel" else "approve"
        if not reviews.decided(conn, draft, settled, draft.review_until):
            continue  # a decision, or another gateway, settled it meanwhile
        if settled == reviews.CANCELED:
            if waits:
                operations.cancel(conn, draft.pipeline_id, codes.ErrorCode.REVIEW_TIMEOUT, actor="review timeout")
            continue
        assert pipeline is not None
        approved = events.PipelineReviewDecided(
            pipeline_id=str(draft.pipeline_id),
            draft_id=str(draft.draft_id),
            decision="approve",
            decided_by=reviews.BY_TIMEOUT,
            decided_at=draft.review_until,
        )
        env = outbox.add(conn, approved, events.PIPELINE_REVIEW_DECIDED, operations.SOURCE)
        projection.record(
            conn,
            pipeline,
            env.id,
            env.type,
            events.Stage(draft.stage),
            "review_decided",
            occurred_at=env.time,
            draft={"id": str(draft.draft_id), "decision": "approve", "timed_out": True},
            actor="review timeout",
        )
    return len(due)
