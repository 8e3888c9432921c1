"""A pipeline's review on the gateway: the draft it projects, the deadline it stops, the decision it takes and carries.

The stage's events are applied to the projection as its consumer applies them; the decisions come through the HTTP
API, with a key or with the link of a `review.requested` notice.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from castad_api import decisions, keys, metrics, operations, repository, reviews, stats, webhooks
from castad_contracts import brief, envelope, events
from castad_runtime import db, links
from castad_runtime import tables as runtime_tables
from pydantic import SecretStr

from tests.integration.gateway import LYRICS, Projection, make_key
from tests.integration.helpers import now
from tests.support.links import LINK_SECRET

pytestmark = pytest.mark.integration

EDIT = "바다의 노래\n\n[verse]\n파도 소리\n창가 자리\n\n[chorus]\n바다책방\n"


def submit(client, review: dict[str, Any] | None = None, callback_url: str | None = None) -> str:
    body = {"customer_name": "Cafe Blue", "region": "Busan", "review": review or {"timeout_s": 600}}
    if callback_url:
        body["callback_url"] = callback_url
    accepted = client.post("/v1/pipelines", json=body, headers={"Idempotency-Key": str(uuid.uuid4())})
    assert accepted.status_code == 202, accepted.text
    return accepted.json()["id"]


def draft(
    gateway: Projection,
    pipeline_id: str,
    attempt: int = 1,
    round_: int = 0,
    wait_s: float = 600,
    on_timeout: str = "cancel",
) -> str:
    """The lyric stage's draft of `attempt`, projected; its id."""
    at = now()
    gateway.event(pipeline_id, events.Stage.LYRIC, "started", attempt, at)
    made = events.LyricDrafted(
        pipeline_id=pipeline_id,
        stage=events.Stage.LYRIC,
        job_id="job-lyric",
        attempt=attempt,
        draft_id=str(uuid.uuid4()),
        round=round_,
        lyrics=LYRICS,
        artifact=events.Artifact(uri="file:///artifacts/lyric", sha256="0" * 64, size=1, media_type="text/plain"),
        review_until=at + dt.timedelta(seconds=wait_s),
        on_timeout=on_timeout,  # type: ignore[arg-type]
        drafted_at=at,
    )
    gateway.deliver(envelope.wrap(made, "lyric.drafted", "/castad/lyric"))
    return made.draft_id


def decided(engine: sa.Engine, pipeline_id: str) -> list[events.PipelineReviewDecided]:
    outbox = runtime_tables.outbox
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(outbox.c.envelope).where(
                outbox.c.pipeline_id == pipeline_id, outbox.c.routing_key == events.PIPELINE_REVIEW_DECIDED
            )
        ).scalars()
        found = [envelope.Envelope.model_validate(row).payload() for row in rows]
    assert all(isinstance(each, events.PipelineReviewDecided) for each in found)
    return found  # type: ignore[return-value]


def pipeline_row(engine: sa.Engine, pipeline_id: str) -> Any:
    with engine.connect() as conn:
        return repository.get_pipeline(conn, uuid.UUID(pipeline_id))


def test_a_draft_stops_the_deadline_and_one_decision_on_it_is_carried_to_the_stage(engines, api, gateway):
    running = api()
    with db.transaction(engines["api"]) as conn:
        made = keys.create(conn, "hana", frozenset({keys.Scope.SUBMIT, keys.Scope.READ}), "hana's marketer")
    hana = running.client(made.key)
    reader = running.client(make_key(engines["api"], "hana", keys.Scope.READ))
    other = running.client(make_key(engines["api"], "jun", keys.Scope.SUBMIT, keys.Scope.READ))
    pipeline_id = submit(hana)
    early = hana.post(f"/v1/pipelines/{pipeline_id}/review", json={"draft": str(uuid.uuid4()), "decision": "approve"})
    assert early.status_code == 409 and "no draft yet" in early.json()["detail"]

    draft_id = draft(gateway, pipeline_id)
    shown = hana.get(f"/v1/pipelines/{pipeline_id}").json()
    assert (shown["status"], shown["deadline_at"]) == ("AWAITING_REVIEW", None)
    assert shown["review"]["draft"]["id"] == draft_id and shown["review"]["draft"]["text"] == LYRICS.text()
    assert shown["review"]["asked"] == {"lyrics": True, "timeout_s": 600, "on_timeout": "cancel"}
    # Past its deadline while it waits: the sweeper leaves it alone.
    with db.transaction(engines["api"]) as conn:
        conn.execute(
            repository.pipelines.update()
            .where(repository.pipelines.c.id == uuid.UUID(pipeline_id))
            .values(deadline_at=sa.func.now() - dt.timedelta(minutes=1))
        )
        assert operations.cancel_overdue(conn) == 0

    path = f"/v1/pipelines/{pipeline_id}/review"
    assert reader.post(path, json={"draft": draft_id, "decision": "approve"}).status_code == 403
    assert other.post(path, json={"draft": draft_id, "decision": "approve"}).status_code == 404
    unsung = hana.post(path, json={"draft": draft_id, "decision": "edit", "lyrics": "제목\n\n[verse]\n" + "가" * 121})
    assert unsung.status_code == 422
    assert (
        unsung.json()["detail"][0]["loc"] == ["body", "lyrics"] and "more than 120" in unsung.json()["detail"][0]["msg"]
    )
    for refused in (
        {"decision": "approve", "lyrics": EDIT},
        {"decision": "edit"},
        {"decision": "approve", "note": "x"},
    ):
        answer = hana.post(path, json={"draft": draft_id, **refused})
        assert answer.status_code == 422, (refused, answer.text)
    accepted = hana.post(path, json={"draft": draft_id, "decision": "edit", "lyrics": EDIT})
    assert accepted.status_code == 202 and accepted.json()["status"] == "AWAITING_REVIEW", accepted.text
    again = hana.post(path, json={"draft": draft_id, "decision": "approve"})
    assert again.status_code == 409 and "already decided: edit" in again.json()["detail"]

    [carried] = decided(engines["api"], pipeline_id)
    assert (carried.draft_id, carried.decision, carried.lyrics) == (
        draft_id,
        "edit",
        events.lyrics_from_text(EDIT, brief.Language.KOREAN),
    )
    assert carried.decided_by == str(made.id)
    shown = hana.get(path).json()["draft"]
    assert (shown["decision"], shown["edited_text"]) == ("edit", EDIT)
    # The stage completes: the deadline runs again, moved on by as long as it stood still (an hour, here).
    with db.transaction(engines["api"]) as conn:
        conn.execute(
            repository.pipelines.update()
            .where(repository.pipelines.c.id == uuid.UUID(pipeline_id))
            .values(deadline_paused_at=sa.func.now() - dt.timedelta(hours=1))
        )
    before = pipeline_row(engines["api"], pipeline_id).deadline_at
    gateway.event(pipeline_id, events.Stage.LYRIC, "completed", 1, now())
    row = pipeline_row(engines["api"], pipeline_id)
    assert row.status == "RUNNING" and row.deadline_paused_at is None
    assert abs((row.deadline_at - before) - dt.timedelta(hours=1)) < dt.timedelta(seconds=30)


def test_only_the_current_draft_is_decided_and_a_regenerate_ends_its_attempt(engines, api, gateway):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    pipeline_id = submit(hana)
    first = draft(gateway, pipeline_id)
    path = f"/v1/pipelines/{pipeline_id}/review"

    assert hana.post(path, json={"draft": first, "decision": "regenerate", "note": "밝게"}).status_code == 202
    second = draft(gateway, pipeline_id, attempt=2, round_=1)
    stale = hana.post(path, json={"draft": first, "decision": "approve"})

    assert stale.status_code == 409 and f"current draft is {second}" in stale.json()["detail"]
    assert [(each.decision, each.note) for each in decided(engines["api"], pipeline_id)] == [("regenerate", "밝게")]
    attempts = hana.get(f"/v1/pipelines/{pipeline_id}/timeline").json()["attempts"]
    assert [(each["attempt"], each["outcome"]) for each in attempts] == [(1, "redrafted"), (2, "running")]
    shown = hana.get(path).json()["draft"]
    assert (shown["id"], shown["round"], shown["regenerations_left"]) == (second, 1, brief.MAX_REGENERATIONS - 1)
    with db.transaction(engines["api"]) as conn:  # the last new draft a review may ask for
        conn.execute(reviews.pipeline_reviews.update().values(round=brief.MAX_REGENERATIONS))
    last = hana.post(path, json={"draft": second, "decision": "regenerate"})
    assert last.status_code == 409 and "approve or edit it" in last.json()["detail"]


def settle(engine: sa.Engine) -> int:
    with db.transaction(engine) as conn:
        return decisions.settle_timed_out(conn)


def test_a_draft_timed_out_to_cancel_has_its_pipeline_canceled_once(engines, api, gateway):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    pipeline_id = submit(hana, {"timeout_s": 5, "on_timeout": "cancel"})
    draft_id = draft(gateway, pipeline_id, wait_s=-1)
    expire(gateway, pipeline_id, draft_id, "cancel")
    expire(gateway, pipeline_id, draft_id, "cancel")  # said again: nothing more

    assert settle(engines["api"]) == 1
    assert settle(engines["api"]) == 0
    gateway.event(pipeline_id, events.Stage.LYRIC, "canceled", 1, now(), operation=1)
    for stage in (events.Stage.SONG, events.Stage.VIDEO):
        gateway.event(pipeline_id, stage, "canceled", 0, now(), operation=1)

    shown = hana.get(f"/v1/pipelines/{pipeline_id}").json()
    assert (shown["status"], shown["error_code"], shown["cancel_reason"]) == (
        "CANCELED",
        "review_timeout",
        "review_timeout",
    )
    assert shown["review"]["draft"]["decision"] == "cancel" and shown["review"]["draft"]["expired_at"]
    assert decided(engines["api"], pipeline_id) == []
    late = hana.post(f"/v1/pipelines/{pipeline_id}/review", json={"draft": draft_id, "decision": "approve"})
    assert late.status_code == 409


def test_a_draft_timed_out_to_approve_is_approved_by_the_gateway_unless_a_decision_came_in_time(engines, api, gateway):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    undecided, decided_in_time, never_said = submit(hana), submit(hana), submit(hana)
    first = draft(gateway, undecided, wait_s=-1, on_timeout="approve")
    second = draft(gateway, decided_in_time, on_timeout="approve")
    edited = hana.post(
        f"/v1/pipelines/{decided_in_time}/review", json={"draft": second, "decision": "edit", "lyrics": EDIT}
    )
    with db.transaction(engines["api"]) as conn:  # its review ends; the edit is still on its way to the stage
        conn.execute(reviews.pipeline_reviews.update().values(review_until=sa.func.now() - dt.timedelta(seconds=1)))
    third = draft(gateway, never_said, wait_s=-reviews.BACKSTOP_S - 60, on_timeout="approve")
    for pipeline_id, draft_id in ((undecided, first), (decided_in_time, second)):
        expire(gateway, pipeline_id, draft_id, "approve")

    assert edited.status_code == 202
    assert settle(engines["api"]) == 2  # the undecided one, and the one its stage never said of
    assert [(one.decision, one.decided_by) for one in decided(engines["api"], undecided)] == [("approve", "timeout")]
    assert [one.decision for one in decided(engines["api"], decided_in_time)] == ["edit"]  # the person's, not lost
    assert [one.decision for one in decided(engines["api"], never_said)] == ["approve"]
    late = hana.post(f"/v1/pipelines/{undecided}/review", json={"draft": first, "decision": "approve"})
    assert late.status_code == 409 and "already decided: approve (its timeout)" in late.json()["detail"]
    entries = hana.get(f"/v1/pipelines/{undecided}/timeline").json()["entries"]
    assert [entry["draft"] for entry in entries if entry["status"] == "review_decided"] == [
        {"id": first, "decision": "approve", "timed_out": True}
    ]
    shown = hana.get(f"/v1/pipelines/{decided_in_time}/review").json()["draft"]
    assert (shown["decision"], shown["edited_text"]) == ("edit", EDIT) and shown["expired_at"] is not None
    assert third


def test_a_notice_tells_of_the_draft_with_a_link_that_decides_it_without_a_key(engines, api, gateway):
    secret = SecretStr(LINK_SECRET)
    running = api(link_secret=secret, webhook_allow_private=True, webhook_secret=SecretStr("whsec_" + "A" * 32))
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    pipeline_id = submit(hana, callback_url="http://127.0.0.1:9/hook")
    draft_id = draft(gateway, pipeline_id)
    with engines["api"].connect() as conn:
        [notice] = conn.execute(
            sa.select(webhooks.webhook_deliveries.c.payload).where(
                webhooks.webhook_deliveries.c.pipeline_id == uuid.UUID(pipeline_id),
                webhooks.webhook_deliveries.c.event_type == webhooks.REVIEW_REQUESTED,
            )
        ).scalars()
    sent = webhooks.with_decide_link(notice, secret)
    assert sent == webhooks.with_decide_link(notice, secret)  # the same on every try
    assert sent["data"]["draft"]["id"] == draft_id and sent["data"]["draft"]["text"] == LYRICS.text()
    link = sent["data"]["links"]["decide"]
    anyone = running.client(None)

    shown = anyone.get(link)
    assert shown.status_code == 200 and shown.json()["draft"]["id"] == draft_id
    path, query = link.split("?")
    altered = urllib.parse.parse_qs(query)
    other_draft = f"{path.rsplit('/', 1)[0]}/{uuid.uuid4()}?{query}"
    assert anyone.post(other_draft, json={"decision": "approve"}).status_code == 401
    assert (
        anyone.get(f"{path}?expires={int(altered['expires'][0]) + 1}&signature={altered['signature'][0]}").status_code
        == 401
    )
    assert (
        anyone.post(f"/v1/pipelines/{pipeline_id}/review", json={"draft": draft_id, "decision": "approve"}).status_code
        == 401
    )
    by_link = anyone.post(link, json={"decision": "approve"})
    assert by_link.status_code == 202, by_link.text
    [carried] = decided(engines["api"], pipeline_id)
    assert (carried.decision, carried.decided_by) == ("approve", "link")
    assert anyone.post(link, json={"decision": "approve"}).status_code == 409
    assert links.signer(path) == (links.GATEWAY, links.Purpose.REVIEW)


def test_waiting_drafts_are_counted_with_their_age_in_the_stats_and_the_metrics(engines, api, gateway):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    waiting = [submit(hana) for _ in range(3)]
    for pipeline_id in waiting:
        draft(gateway, pipeline_id)
    canceled = waiting.pop()
    gateway.cancel(canceled)  # a pipeline canceled while its draft waited: no longer waiting

    numbers = stats.read(engines["api"], 900, 60.0)
    gauges = {family.name: family.samples[0].value for family in metrics.WaitingReviews(engines["api"]).read()}

    shown = {one.pipeline_id for one in numbers.reviews.oldest}
    assert numbers.reviews.waiting >= 2 and shown >= set(waiting)
    assert canceled not in shown
    assert all(one.waiting_s >= 0 for one in numbers.reviews.oldest)
    assert gauges["castad_reviews_waiting"] == numbers.reviews.waiting
    assert gauges["castad_review_oldest_wait_seconds"] >= 0


def expire(gateway: Projection, pipeline_id: str, draft_id: str, on_timeout: str) -> None:
    said = events.StageReviewExpired(
        pipeline_id=pipeline_id,
        stage=events.Stage.LYRIC,
        job_id="job-lyric",
        attempt=1,
        draft_id=draft_id,
        on_timeout=on_timeout,  # type: ignore[arg-type]
        expired_at=now(),
    )
    gateway.deliver(envelope.wrap(said, "lyric.review_expired", "/castad/lyric"))
