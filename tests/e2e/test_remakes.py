"""A finished pipeline made again from one stage on, with changes: the stages before copy their files, asking nothing.

Each stage before the one made again has its provider broken for good while the remake runs (every call it made
would fail the pipeline): the remake succeeding shows that none was made.
"""

from __future__ import annotations

import uuid

import pytest
from castad_contracts import api, brief
from castad_testkit import briefs

from tests.e2e.conftest import SharedCastad
from tests.e2e.test_cli import cli

pytestmark = pytest.mark.e2e

BROKEN = {"permanent_rate": 1.0}  # every provider call fails for good


def finished(shared: SharedCastad, **fields) -> api.PipelineView:
    pipeline_id = shared.submit(briefs.sample(**fields))
    view = shared.wait_terminal([pipeline_id])[pipeline_id]
    assert view.status == "SUCCEEDED"
    return view


def remake(shared: SharedCastad, pipeline_id: str, body: dict, key: str | None = None):
    headers = {"Idempotency-Key": key or str(uuid.uuid4())}
    return shared.http.post(f"/v1/pipelines/{pipeline_id}/remake", json=body, headers=headers)


def stage(view: api.PipelineView, name: str) -> api.StageView:
    return next(each for each in view.stages if each.stage.value == name)


@pytest.mark.timeout(240)
def test_a_remake_from_video_copies_the_lyrics_and_the_song_and_makes_only_a_new_video(shared: SharedCastad):
    source = finished(shared)
    for reused in ("lyric", "song"):
        shared.faults(reused, **BROKEN)
    key = str(uuid.uuid4())
    body = {"from": "video", "changes": {"orientation": "horizontal"}}

    accepted = remake(shared, source.id, body, key)
    assert accepted.status_code == 202, accepted.text
    made = shared.wait_terminal([accepted.json()["id"]])[accepted.json()["id"]]
    again = remake(shared, source.id, body, key)

    assert made.status == "SUCCEEDED", (made.error_code, made.error_message)
    assert again.status_code == 202 and again.json()["id"] == made.id and again.json()["created"] is False
    assert made.remake_of is not None and (made.remake_of.id, made.remake_of.from_.value) == (source.id, "video")
    assert shared.client.status(source.id).remakes == [made.id]
    assert made.brief.orientation is brief.Orientation.HORIZONTAL
    assert made.brief.customer_name == source.brief.customer_name
    for name in ("lyric", "song"):
        copied, original = stage(made, name), stage(source, name)
        assert copied.reused_from == source.id and copied.artifact and original.artifact
        assert copied.artifact.sha256 == original.artifact.sha256  # the same bytes, copied into the remake's place
        assert copied.artifact.download != original.artifact.download
    video = stage(made, "video")
    assert video.reused_from is None and [form.format for form in video.formats] == ["16:9"]
    assert video.artifact and video.artifact.sha256 != stage(source, "video").artifact.sha256  # type: ignore[union-attr]


@pytest.mark.timeout(240)
def test_a_remake_from_song_sings_the_same_lyrics_in_another_genre(shared: SharedCastad):
    source = finished(shared)
    shared.faults("lyric", **BROKEN)

    accepted = remake(shared, source.id, {"from": "song", "changes": {"genre": "trot, brass band"}})
    assert accepted.status_code == 202, accepted.text
    made = shared.wait_terminal([accepted.json()["id"]])[accepted.json()["id"]]

    assert made.status == "SUCCEEDED", (made.error_code, made.error_message)
    assert made.brief.genre == "trot, brass band" and made.brief.orientation is source.brief.orientation
    assert stage(made, "lyric").reused_from == source.id
    assert stage(made, "song").reused_from is None and stage(made, "video").reused_from is None
    assert stage(made, "lyric").artifact.sha256 == stage(source, "lyric").artifact.sha256  # type: ignore[union-attr]


def test_a_remake_is_refused_with_the_reason(shared: SharedCastad):
    review = brief.Review(timeout_s=600)
    waiting = shared.client.submit(api.PipelineRequest(**briefs.sample().model_dump(), review=review)).id

    not_ended = remake(shared, waiting, {"from": "video"})
    keeps_song = remake(shared, waiting, {"from": "video", "changes": {"genre": "jazz"}})
    unknown = remake(shared, str(uuid.uuid4()), {"from": "song"})
    wrong_stage = remake(shared, waiting, {"from": "lyric"})
    told = cli(shared.base_url, "remake", waiting, "--from", "video", "--no-watch", key=shared.api_key)
    refused_here = cli(shared.base_url, "remake", waiting, "--from", "video", "--genre", "jazz", key=shared.api_key)

    assert not_ended.status_code == 409 and "needs it ended" in not_ended.json()["detail"]
    assert keeps_song.status_code == 422
    assert keeps_song.json()["detail"][0]["loc"] == ["body", "changes"]
    assert "cannot change genre" in keeps_song.json()["detail"][0]["msg"]
    assert unknown.status_code == 404
    assert wrong_stage.status_code == 422 and wrong_stage.json()["detail"][0]["loc"] == ["body", "from"]
    assert told.returncode == 5 and told.stderr.count("\n") == 1 and "409" in told.stderr, told.stderr
    assert refused_here.returncode == 2 and "cannot change genre" in refused_here.stderr, refused_here.stderr
