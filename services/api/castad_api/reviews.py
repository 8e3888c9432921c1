"""Reviews of a pipeline's drafts: what the gateway records of them, and a decision, carried to the stage.

The stage that drafted owns the wait (castad_runtime.stage.reviews). The gateway:

- records each draft as its projection applies `<stage>.drafted` (`drafted`), and its timeout
  (`<stage>.review_expired`, `expired`);
- stops the pipeline's deadline while it is AWAITING_REVIEW and moves it on by as long after (repository.pause_deadline,
  resume_deadline, from the projection's `record`);
- takes one decision on the current draft until its review times out (decisions.decide, POST
  /v1/pipelines/{id}/review or a signed link of its notice), recorded with the acting key (`decided`) and carried
  to the stage as `pipeline.review_decided` through its outbox;
- settles each draft the stage says timed out that no decision was taken on (decisions.settle_timed_out, woken
  with the deadlines): it sends the draft's approval, or cancels the pipeline, as its review's `on_timeout` says.
  The gateway alone takes decisions and settles timeouts, one at a time for a draft (`decided` takes only an
  unsettled one), so a decision taken in time is the draft's however late it reaches the stage. Should the stage
  never say (down for long), the gateway settles a draft `BACKSTOP_S` after its review anyway.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from castad_contracts import api, brief, events
from castad_runtime import db
from psycopg.types.json import Jsonb

from castad_api import records
from castad_api.tables import pipeline_reviews

CANCELED = "cancel"  # a draft's settlement when its pipeline is canceled (by its timeout, or before it)
BY_LINK, BY_TIMEOUT = "link", "timeout"  # who decided, when no key did (PipelineReviewDecided.decided_by)
BACKSTOP_S = 3600.0  # a draft is settled this long after its review even if its stage never said it timed out
# Drafts waiting for a decision now: not settled, not timed out, of a pipeline that waits (pipeline_reviews_open).
WAITING = """
FROM pipeline_reviews r JOIN pipelines p ON p.id = r.pipeline_id
WHERE r.decision IS NULL AND r.expired_at IS NULL AND p.status = 'AWAITING_REVIEW'"""


@dataclasses.dataclass(frozen=True)
class Draft:
    """A draft as the gateway recorded it (a row of pipeline_reviews)."""

    draft_id: uuid.UUID
    pipeline_id: uuid.UUID
    stage: str
    attempt: int
    round: int
    lyrics: dict[str, Any]
    review_until: dt.datetime
    on_timeout: str
    drafted_at: dt.datetime
    decision: str | None
    edited: dict[str, Any] | None
    note: str | None
    decided_by: uuid.UUID | None
    decided_at: dt.datetime | None
    expired_at: dt.datetime | None

    @property
    def open(self) -> bool:
        """Whether it still waits for a decision."""
        return self.decision is None and self.expired_at is None

    def view(self) -> api.DraftView:
        lyrics = events.Lyrics.model_validate(self.lyrics)
        return api.DraftView(
            id=str(self.draft_id),
            stage=events.Stage(self.stage),
            round=self.round,
            text=lyrics.text(),
            drafted_at=self.drafted_at,
            review_until=self.review_until,
            on_timeout=self.on_timeout,
            regenerations_left=max(brief.MAX_REGENERATIONS - self.round, 0),
            decision=self.decision,
            edited_text=events.Lyrics.model_validate(self.edited).text() if self.edited else None,
            note=self.note,
            decided_at=self.decided_at,
            decided_by_key_id=str(self.decided_by) if self.decided_by else None,
            expired_at=self.expired_at,
        )


_COLUMNS = [pipeline_reviews.c[field.name] for field in dataclasses.fields(Draft)]


# The projection's statements, as plain SQL (castad_runtime.db.run): it runs them in a pipelined block.
_DRAFTED = """
INSERT INTO pipeline_reviews (draft_id, pipeline_id, stage, attempt, round, lyrics, review_until, on_timeout,
                              drafted_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (draft_id) DO NOTHING
"""
# The stage said the draft's review timed out: settled by decisions.settle_timed_out, unless a decision was taken.
_EXPIRED = "UPDATE pipeline_reviews SET expired_at = %s WHERE draft_id = %s AND expired_at IS NULL"


def drafted(conn: sa.Connection, pipeline_id: uuid.UUID, payload: events.LyricDrafted) -> None:
    """Record a draft the projection applied (a redelivered one changes nothing)."""
    row = (
        uuid.UUID(payload.draft_id),
        pipeline_id,
        payload.stage.value,
        payload.attempt,
        payload.round,
        Jsonb(payload.lyrics.model_dump(mode="json")),
        payload.review_until,
        payload.on_timeout,
        payload.drafted_at,
    )
    db.run(conn, _DRAFTED, row)


def expired(conn: sa.Connection, payload: events.StageReviewExpired) -> None:
    db.run(conn, _EXPIRED, (payload.expired_at, uuid.UUID(payload.draft_id)))


def current(conn: sa.Connection, pipeline_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Draft]:
    """Each pipeline's newest draft, of those that have one."""
    if not pipeline_ids:
        return {}
    newest = (
        sa.select(pipeline_reviews.c.pipeline_id, sa.func.max(pipeline_reviews.c.round))
        .where(pipeline_reviews.c.pipeline_id.in_(pipeline_ids))
        .group_by(pipeline_reviews.c.pipeline_id)
    )
    rows = conn.execute(
        sa.select(*_COLUMNS).where(sa.tuple_(pipeline_reviews.c.pipeline_id, pipeline_reviews.c.round).in_(newest))
    )
    return {row.pipeline_id: Draft(**row._asdict()) for row in rows}


def view(row: records.Pipeline, draft: Draft | None) -> api.ReviewView | None:
    if row.review is None:
        return None
    return api.ReviewView(asked=brief.Review.model_validate(row.review), draft=draft and draft.view())


def decided(
    conn: sa.Connection,
    draft: Draft,
    decision: str,
    at: dt.datetime | None,
    key_id: uuid.UUID | None = None,
    edited: events.Lyrics | None = None,
    note: str | None = None,
) -> bool:
    """Settle the draft with `decision`, if nothing settled it before; whether this did."""
    settled = conn.execute(
        pipeline_reviews.update()
        .where(pipeline_reviews.c.draft_id == draft.draft_id, pipeline_reviews.c.decision.is_(None))
        .values(
            decision=decision,
            edited=edited and edited.model_dump(mode="json"),
            note=note,
            decided_by=key_id,
            decided_at=at,
        )
    )
    return settled.rowcount == 1


def due(conn: sa.Connection, limit: int) -> list[Draft]:
    """Drafts to settle: timed out, as their stage said or BACKSTOP_S ago, with no decision (pipeline_reviews_open).

    Not locked: whoever settles one locks its pipeline first, as a decision does, and settles it only if nothing did
    meanwhile (`decided`)."""
    now = sa.func.now()
    rows = conn.execute(
        sa.select(*_COLUMNS)
        .where(
            pipeline_reviews.c.decision.is_(None),
            pipeline_reviews.c.review_until <= now,
            sa.or_(
                pipeline_reviews.c.expired_at.is_not(None),
                pipeline_reviews.c.review_until <= now - sa.func.make_interval(0, 0, 0, 0, 0, 0, BACKSTOP_S),
            ),
        )
        .order_by(pipeline_reviews.c.review_until)
        .limit(limit)
    )
    return [Draft(**row._asdict()) for row in rows]


def waiting(conn: sa.Connection) -> tuple[int, float]:
    """The drafts that wait for a decision now (`WAITING`), and the longest wait in seconds."""
    row = conn.execute(sa.text(f"SELECT count(*), extract(epoch FROM now() - min(r.drafted_at)) {WAITING}")).one()
    return row[0], float(row[1] or 0.0)
