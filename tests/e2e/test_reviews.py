"""A brief that asks for a review: the lyrics' draft waits for a person before anything is paid for.

The lyric stage owns the wait (a job in REVIEW, no worker, no lease), through a restart of its service; the gateway
carries the decision. Each policy of a draft left undecided, a decision sent as soon as the draft exists, one for a
draft that a new one replaced, and the limits an edit is held to.
"""

from __future__ import annotations

import re
import time
import uuid

import pytest
from castad_cli import client as client_
from castad_contracts import api, brief, envelope, events
from castad_testkit import briefs

from tests.e2e.conftest import SharedCastad
from tests.e2e.test_cli import cli

pytestmark = pytest.mark.e2e

EDITED = (
    "동명항 책방의 노래\n\n[verse]\n파도 소리 책장 넘기는 소리\n창가에 앉아 바다를 읽어요\n\n[chorus]\n바다책방 속초\n"
)


def submit(shared: SharedCastad, timeout_s: int = 600, on_timeout: str = "cancel") -> str:
    review = brief.Review(timeout_s=timeout_s, on_timeout=on_timeout)  # type: ignore[arg-type]
    return shared.client.submit(api.PipelineRequest(**briefs.sample().model_dump(), review=review)).id


def drafted(shared: SharedCastad, pipeline_id: str, after: str | None = None) -> api.PipelineView:
    """The pipeline once it waits for a review of a draft (another than `after`)."""

    def waiting() -> api.PipelineView | None:
        view = shared.client.status(pipeline_id)
        draft = view.review and view.review.draft
        ready = view.status == "AWAITING_REVIEW" and draft and draft.id != after and draft.decision is None
        return view if ready else None

    return shared.wait_until("a draft waiting for review", waiting, timeout_s=60)


def sung(shared: SharedCastad, pipeline_id: str) -> events.SongCompleted:
    [told] = [
        row["envelope"]
        for row in shared.dbs.outbox_of("song", pipeline_id)
        if row["routing_key"].endswith("song.completed")
    ]
    song = envelope.Envelope.model_validate(told).payload()
    assert isinstance(song, events.SongCompleted)
    return song


def lines_of(text: str) -> list[str]:
    """The sung lines of lyrics written as a draft's text: all but the title and the section headings."""
    return [line for line in text.splitlines()[1:] if line and not line.startswith("[")]


@pytest.mark.timeout(240)
def test_an_edit_made_while_the_stage_restarted_is_sung_and_captioned_as_written(shared: SharedCastad, tmp_path):
    pipeline_id = submit(shared)
    view = drafted(shared, pipeline_id)
    assert view.review is not None and view.review.draft is not None
    draft = view.review.draft
    assert view.deadline_at is None  # it stands still while a person decides
    # No worker is held: the job waits in REVIEW without a lease, and nothing after it has begun.
    [job] = shared.dbs.jobs_of("lyric", [pipeline_id])
    assert (job["status"], job["lease_owner"], job["review"]["draft_id"]) == ("REVIEW", None, draft.id)
    assert shared.dbs.jobs_of("song", [pipeline_id]) == []

    # The lyric service stops while the draft waits; the edit is decided, and waits in its queue, meanwhile.
    shared.services.stop("lyric")
    edit = tmp_path / "lyrics.txt"
    edit.write_text(EDITED, encoding="utf-8")
    decided = cli(shared.base_url, "review", pipeline_id, "--edit", str(edit), key=shared.api_key)
    assert decided.returncode == 0 and f"edit of draft {draft.id} recorded" in decided.stdout, decided.stderr
    again = cli(shared.base_url, "review", pipeline_id, "--approve", "--draft", draft.id, key=shared.api_key)
    assert again.returncode == 5 and "409" in again.stderr and "already decided" in again.stderr, again.stderr
    with pytest.raises(client_.GatewayError) as refused:
        shared.client.decide(pipeline_id, api.ReviewDecision(draft=draft.id, decision="approve"))
    assert refused.value.status == 409
    lyric_queue = shared.installation.topology.queue("lyric")
    shared.wait_until("the decision waiting in the stopped stage's queue", lambda: shared.broker.ready(lyric_queue))
    [job] = shared.dbs.jobs_of("lyric", [pipeline_id])
    assert job["status"] == "REVIEW"
    shared.services.start("lyric")

    final = shared.wait_terminal([pipeline_id])[pipeline_id]
    assert final.status == "SUCCEEDED" and final.deadline_at is not None
    assert final.review is not None and final.review.draft is not None
    assert (final.review.draft.decision, final.review.draft.edited_text) == ("edit", EDITED)
    song = sung(shared, pipeline_id)
    lines = [line.text for line in song.timed_lines if line.text.strip()]
    assert lines == lines_of(EDITED)
    assert "".join(s.text for line in song.timed_lines for s in line.syllables).replace(" ", "") == "".join(
        lines
    ).replace(" ", "")
    captions = shared.http.get(f"/v1/pipelines/{pipeline_id}/artifacts/song/captions.vtt").text
    for line in lines:
        assert re.sub(r"<[^>]+>", "", captions).count(line) == 1, captions
    [job] = shared.dbs.jobs_of("lyric", [pipeline_id])
    assert (job["status"], job["attempts"], job["counted_attempts"]) == ("SUCCEEDED", 1, 0)
    assert job["review"]["decided"]["decision"] == "edit"
    told = [entry.draft for entry in shared.client.timeline(pipeline_id).entries if entry.status == "review_decided"]
    assert [(entry or {}).get("decision") for entry in told] == ["edit"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("on_timeout", ["approve", "cancel"])
def test_a_draft_no_one_decides_on_comes_to_what_its_review_says(shared: SharedCastad, on_timeout):
    pipeline_id = submit(shared, timeout_s=5, on_timeout=on_timeout)
    drafted(shared, pipeline_id)

    final = shared.wait_terminal([pipeline_id], timeout_s=60)[pipeline_id]

    assert final.review is not None and final.review.draft is not None
    assert final.review.draft.expired_at is not None and final.review.draft.decided_by_key_id is None
    if on_timeout == "approve":
        assert final.status == "SUCCEEDED" and final.review.draft.decision == "approve"
        assert sung(shared, pipeline_id).timed_lines  # the draft as it was, sung
    else:
        assert (final.status, final.error_code) == ("CANCELED", "review_timeout")
        assert final.review.draft.decision == "cancel"
        [song] = shared.dbs.jobs_of("song", [pipeline_id])  # canceled before its trigger: nothing paid for
        assert (song["status"], song["input"], song["attempts"]) == ("CANCELED", None, 0)
        [job] = shared.dbs.jobs_of("lyric", [pipeline_id])
        assert job["status"] == "CANCELED"


@pytest.mark.timeout(120)
def test_a_decision_sent_the_moment_the_draft_exists_is_applied_and_none_before_it_is_lost(shared: SharedCastad):
    pipeline_id = submit(shared)
    with pytest.raises(client_.GatewayError) as early:  # before the draft exists, a client is told so
        shared.client.decide(pipeline_id, api.ReviewDecision(draft=str(uuid.uuid4()), decision="approve"))
    assert early.value.status == 409
    refused_before = 1
    deadline = time.monotonic() + 60
    while True:  # a client deciding as soon as it can: before the draft exists, it is told so
        view = shared.client.status(pipeline_id)
        draft = view.review and view.review.draft
        if draft is not None:
            shared.client.decide(pipeline_id, api.ReviewDecision(draft=draft.id, decision="approve"))
            break
        with pytest.raises(client_.GatewayError) as early:
            shared.client.decide(
                pipeline_id, api.ReviewDecision(draft="00000000-0000-4000-8000-000000000000", decision="approve")
            )
        assert early.value.status == 409
        refused_before += 1
        assert time.monotonic() < deadline, "no draft within 60 s"

    final = shared.wait_terminal([pipeline_id])[pipeline_id]

    assert final.status == "SUCCEEDED" and refused_before >= 1
    assert final.review is not None and final.review.draft is not None and final.review.draft.decision == "approve"


@pytest.mark.timeout(180)
def test_a_new_draft_replaces_the_old_one_whose_decisions_are_refused(shared: SharedCastad):
    pipeline_id = submit(shared)
    first = drafted(shared, pipeline_id).review.draft  # type: ignore[union-attr]
    assert first is not None
    with pytest.raises(client_.GatewayError) as unreadable:
        shared.client.decide(
            pipeline_id, api.ReviewDecision(draft=first.id, decision="edit", lyrics="[verse]\nno title")
        )
    assert unreadable.value.status == 422 and "lyrics" in str(unreadable.value)

    asked = api.ReviewDecision(draft=first.id, decision="regenerate", note="더 밝게")
    assert shared.client.decide(pipeline_id, asked).status == "AWAITING_REVIEW"
    second = drafted(shared, pipeline_id, after=first.id).review.draft  # type: ignore[union-attr]
    assert second is not None and second.round == 1 and second.text != first.text
    for stale in ("approve", "regenerate"):
        with pytest.raises(client_.GatewayError) as refused:
            shared.client.decide(pipeline_id, api.ReviewDecision(draft=first.id, decision=stale))  # type: ignore[arg-type]
        assert refused.value.status == 409 and "current draft" in str(refused.value)
    shared.client.decide(pipeline_id, api.ReviewDecision(draft=second.id, decision="approve"))

    final = shared.wait_terminal([pipeline_id])[pipeline_id]

    assert final.status == "SUCCEEDED"
    [job] = shared.dbs.jobs_of("lyric", [pipeline_id])
    assert (job["attempts"], job["counted_attempts"]) == (2, 0)  # the new draft's attempt counted no failure
    outcomes = [row["outcome"] for row in shared.dbs.attempts_of("lyric", job["id"])]
    assert sorted(outcomes) == ["redrafted", "succeeded"]
    sung_lines = [line.text for line in sung(shared, pipeline_id).timed_lines if line.text.strip()]
    assert sung_lines == lines_of(second.text)


def test_the_command_line_shows_the_draft_and_refuses_two_decisions_at_once(shared: SharedCastad):
    pipeline_id = submit(shared)
    draft = drafted(shared, pipeline_id).review.draft  # type: ignore[union-attr]
    assert draft is not None

    shown = cli(shared.base_url, "review", pipeline_id, key=shared.api_key)
    both = cli(shared.base_url, "review", pipeline_id, "--approve", "--regenerate", key=shared.api_key)
    missing = cli(shared.base_url, "review", pipeline_id, "--edit", "/nonexistent.txt", key=shared.api_key)

    assert shown.returncode == 0 and draft.id in shown.stdout and draft.text.splitlines()[0] in shown.stdout
    assert both.returncode == 2 and both.stderr.count("\n") == 1 and "not --approve and --regenerate" in both.stderr
    assert missing.returncode == 2 and "--edit /nonexistent.txt" in missing.stderr
