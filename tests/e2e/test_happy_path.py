"""One brief through every service: lyrics, a song and a video, all downloadable."""

from __future__ import annotations

import hashlib

import pytest

pytestmark = pytest.mark.e2e


def test_a_brief_becomes_lyrics_a_song_and_a_video(castad):
    running = castad()
    pipeline_id = running.submit()

    view = running.wait_terminal([pipeline_id])[pipeline_id]

    assert view.status == "SUCCEEDED"
    assert [stage.stage.value for stage in view.stages] == ["lyric", "song", "video"]
    for stage in view.stages:
        assert stage.status == "SUCCEEDED"
        assert stage.artifact is not None
        download = running.http.get(f"/v1/pipelines/{pipeline_id}/artifacts/{stage.stage.value}")
        assert download.status_code == 200
        assert hashlib.sha256(download.content).hexdigest() == stage.artifact.sha256
        assert len(download.content) == stage.artifact.size
        suffix = {"lyric": ".txt", "song": ".wav", "video": ".mp4"}[stage.stage.value]
        disposition = download.headers["content-disposition"]
        assert disposition.endswith(f'filename="{pipeline_id}-{stage.stage.value}{suffix}"'), disposition
