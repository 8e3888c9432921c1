"""The stage's side of a review: its draft waits in REVIEW, and each decision or timeout is applied once.

The lyric stage's runner, with a work that drafts as the lyric service's does when the brief asks for a review, on a
real PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from castad_contracts import brief, events
from castad_runtime import db, tables
from castad_runtime.stage import cancellation, outcomes, repository, reviews, runner
from castad_runtime.stage.repository import drafts

from tests.integration.helpers import now, output, pipeline_requested, stage_runner
from tests.integration.test_stage_runner import emitted

pytestmark = pytest.mark.integration

REVIEW = brief.Review(timeout_s=600, on_timeout="approve")
EDITED = events.Lyrics(
    title="고친 노래",
    language=brief.Language.KOREAN,
    sections=(events.LyricSection(kind="chorus", lines=("고친 줄",)),),
)
NOTES: list[Any] = []  # what each draft was told to change


@pytest.fixture
def engine(engines: Mapping[str, sa.Engine]) -> sa.Engine:
    return engines["lyric"]


def drafting(review: brief.Review) -> runner.Work:
    """A work that drafts, as the lyric service's does for a brief asking for `review`."""

    def draft(job: repository.Job, cancel: cancellation.Cancellation) -> outcomes.Drafted:
        NOTES.append((job.review or {}).get("note"))
        return outcomes.Drafted(output(), review)

    return draft


def keep_edit(pipeline_id: str, lyrics: events.Lyrics) -> outcomes.Output:
    artifact = events.Artifact(uri="file:///edit.txt", sha256="1" * 64, size=2, media_type="text/plain")
    return outcomes.Output(artifact, {"lyrics": lyrics})


def drafted_job(
    engine: sa.Engine, review: brief.Review = REVIEW
) -> tuple[runner.StageRunner, reviews.Reviews, repository.Job]:
    """A job whose first attempt drafted: in REVIEW."""
    stage = stage_runner(engine, drafting(review))
    request = pipeline_requested(review=review)
    with db.transaction(engine) as conn:
        assert stage.accept(conn, request)
    claim = stage.claim_next()
    assert claim is not None
    stage.execute(claim)
    return stage, reviews.Reviews(stage, keep_edit), job(engine, request.pipeline_id)


def job(engine: sa.Engine, pipeline_id: str) -> repository.Job:
    with engine.connect() as conn:
        found = drafts.lock_job(conn, pipeline_id)
    assert found is not None
    return found


def decision(held: repository.Job, decided: str, **fields: Any) -> events.PipelineReviewDecided:
    assert held.review is not None
    return events.PipelineReviewDecided(
        pipeline_id=held.pipeline_id,
        draft_id=fields.pop("draft_id", held.review["draft_id"]),
        decision=decided,  # type: ignore[arg-type]
        decided_by=str(uuid.uuid4()),
        decided_at=now(),
        **fields,
    )


def decide(drafts: reviews.Reviews, engine: sa.Engine, given: events.PipelineReviewDecided) -> bool:
    edited = drafts.edited(given)
    with db.transaction(engine) as conn:
        return drafts.decide(conn, given, edited)


def test_a_draft_waits_holding_no_worker_and_is_no_job_to_claim(engine):
    stage, _, held = drafted_job(engine)

    assert (held.status, held.attempts, held.counted_attempts) == ("REVIEW", 1, 0)
    assert held.review is not None and held.review["round"] == 0
    with engine.connect() as conn:
        row = conn.execute(sa.select(tables.jobs).where(tables.jobs.c.id == held.id)).one()
    assert row.lease_owner is None and row.due_at > now() + dt.timedelta(seconds=590)
    assert stage.claim_next() is None
    [(kind, data)] = [each for each in emitted(engine, held.pipeline_id) if each[0] == "lyric.drafted"]
    assert data["draft_id"] == held.review["draft_id"] and data["on_timeout"] == "approve"
    assert events.Lyrics.model_validate(data["lyrics"]) == output().details["lyrics"]


def test_an_edit_completes_the_job_with_its_words_once_whatever_is_redelivered(engine):
    _, drafts, held = drafted_job(engine)
    edit = decision(held, "edit", lyrics=EDITED)

    assert decide(drafts, engine, edit) is False
    assert decide(drafts, engine, edit) is False  # redelivered: left alone
    assert decide(drafts, engine, decision(held, "approve")) is False  # a second decision too

    done = job(engine, held.pipeline_id)
    assert done.status == "SUCCEEDED" and done.review is not None and done.review["decided"]["decision"] == "edit"
    [completed] = [data for kind, data in emitted(engine, held.pipeline_id) if kind == "lyric.completed"]
    assert events.Lyrics.model_validate(completed["lyrics"]) == EDITED
    assert completed["artifact"]["uri"] == "file:///edit.txt" and completed["attempt"] == 1


def test_a_decision_for_another_draft_changes_nothing(engine):
    _, drafts, held = drafted_job(engine)

    assert decide(drafts, engine, decision(held, "approve", draft_id=str(uuid.uuid4()))) is False

    assert job(engine, held.pipeline_id).status == "REVIEW"
    assert not [kind for kind, _ in emitted(engine, held.pipeline_id) if kind == "lyric.completed"]


def test_a_regenerate_drafts_again_on_an_attempt_no_failure_counted_told_the_note(engine):
    stage, drafts, held = drafted_job(engine)
    NOTES.clear()

    assert decide(drafts, engine, decision(held, "regenerate", note="더 밝게")) is True
    claim = stage.claim_next()
    assert claim is not None
    stage.execute(claim)

    again = job(engine, held.pipeline_id)
    assert (again.status, again.attempts, again.counted_attempts) == ("REVIEW", 2, 0)
    assert (
        again.review is not None and again.review["round"] == 1 and again.review["draft_id"] != held.review["draft_id"]
    )
    assert NOTES == ["더 밝게"]
    with engine.connect() as conn:
        outcomes = conn.execute(
            sa.select(tables.attempts.c.number, tables.attempts.c.outcome)
            .where(tables.attempts.c.job_id == held.id)
            .order_by(tables.attempts.c.number)
        ).all()
    assert [tuple(row) for row in outcomes] == [(1, "redrafted"), (2, "running")]


def past_its_review(engine: sa.Engine, held: repository.Job) -> None:
    with db.transaction(engine) as conn:
        conn.execute(tables.jobs.update().where(tables.jobs.c.id == held.id).values(due_at=sa.func.now()))


def test_a_draft_past_its_review_is_said_to_have_timed_out_and_waits_for_the_gateways_word(engine):
    _, drafts, held = drafted_job(engine)
    past_its_review(engine, held)

    assert drafts.expire_due() >= 1
    assert drafts.expire_due() == 0  # said; said again in an hour if no word came
    with engine.connect() as conn:
        due_at = conn.execute(sa.select(tables.jobs.c.due_at).where(tables.jobs.c.id == held.id)).scalar_one()
    assert due_at > now() + dt.timedelta(seconds=reviews.ASK_AGAIN_S - 60)

    after = job(engine, held.pipeline_id)
    kinds = [kind for kind, _ in emitted(engine, held.pipeline_id)]
    assert after.status == "REVIEW" and after.review is not None and "expired_at" in after.review
    assert kinds.count("lyric.review_expired") == 1 and "lyric.completed" not in kinds
    # The gateway's word: a decision it took in time, however late it comes, or the approval its timeout sends.
    assert decide(drafts, engine, decision(held, "edit", lyrics=EDITED)) is False
    assert job(engine, held.pipeline_id).status == "SUCCEEDED"
    [completed] = [data for kind, data in emitted(engine, held.pipeline_id) if kind == "lyric.completed"]
    assert events.Lyrics.model_validate(completed["lyrics"]) == EDITED


def test_a_cancel_ends_a_draft_waiting_for_review_and_its_attempt(engine):
    stage, _, held = drafted_job(engine)
    cancel = events.PipelineCancelRequested(pipeline_id=held.pipeline_id, operation=1, reason="review_timeout")

    with db.transaction(engine) as conn:
        stage.apply_cancel(conn, cancel)

    assert job(engine, held.pipeline_id).status == "CANCELED"
    with engine.connect() as conn:
        [outcome] = conn.execute(
            sa.select(tables.attempts.c.outcome).where(tables.attempts.c.job_id == held.id)
        ).scalars()
    assert outcome == "canceled"
