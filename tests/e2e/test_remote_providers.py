"""All three stages calling network providers, every service its own process.

The providers are local fake servers that behave like the documented APIs: lyrics from a Chat Completions server,
songs from a Suno-shaped music API, videos from Creatomate's render API v2. The music and render APIs call the
gateway back when done; the first scheduled poll is set far off, so a pipeline that finishes quickly did so through
its callbacks. `make bench-providers` runs the same with 200 pipelines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from castad_contracts import codes, topology
from castad_local import stack
from castad_local.fakes import media, suno

from tests.e2e.conftest import RunningCastad
from tests.e2e.test_languages import BRIEFS
from tests.support import installation as installation_
from tests.support import network as network_
from tests.support.installation import Installation
from tests.support.links import signed_path

pytestmark = pytest.mark.e2e
FIRST_POLL_S = 60.0


@pytest.fixture(scope="module")
def installation(migrated_templates, tmp_path_factory) -> Iterator[Installation]:
    """One installation, one stack and one set of fakes for the module: each test looks at its own pipelines."""
    with installation_.made(migrated_templates, tmp_path_factory.mktemp("remote")) as made:
        yield made


@pytest.fixture(scope="module")
def providers() -> Iterator[network_.Fakes]:
    with network_.fakes(song_s=2.0, audio_s=3.0, render_s=1.0) as running:
        yield running


@pytest.fixture(scope="module")
def network(installation, providers, tmp_path_factory):
    port = stack.free_port()
    env = {"CASTAD_API_PORT": str(port), **network_.env(providers, f"http://127.0.0.1:{port}", FIRST_POLL_S)}
    running = RunningCastad.start(installation, env, tmp_path_factory.mktemp("remote-logs"))
    yield running, providers
    running.discard()


def of(pipeline_ids: Iterable[str], items: list[dict[str, Any]], text: Callable[[dict[str, Any]], str]):
    """The items (requests, callbacks) whose `text` names one of these pipelines."""
    return [item for item in items if any(pipeline_id in text(item) for pipeline_id in pipeline_ids)]


def job_attempts(dbs, stage: str, pipeline_id: str) -> list[str]:
    [job] = dbs.jobs_of(stage, [pipeline_id])
    return [attempt["outcome"] for attempt in dbs.attempts_of(stage, job["id"])]


@pytest.mark.timeout(120)
def test_briefs_in_four_languages_go_through_the_three_network_providers_by_their_callbacks(network, dbs):
    running, (lyrics, music, render) = network
    ids = {language: running.submit(source) for language, source in BRIEFS.items()}

    views = running.wait_terminal(list(ids.values()), timeout_s=45)  # less than a first poll: callbacks did it

    for language, pipeline_id in ids.items():
        view = views[pipeline_id]
        assert view.status == "SUCCEEDED", (language, view)
        song, video = view.stages[1].artifact, view.stages[2].artifact
        assert song.media_type == "audio/mpeg" and video.media_type == "video/mp4"
        poster = view.stages[2].poster  # the render's snapshot (the template sets snapshot_time)
        assert poster is not None and running.http.get(poster.download).content == media.jpeg()
        for stage in topology.STAGES:
            assert job_attempts(dbs, stage, pipeline_id) == ["succeeded"]
            completed = [r for r in dbs.outbox_of(stage, pipeline_id) if r["routing_key"] == f"{stage}.completed"]
            assert len(completed) == 1
    submits = [r for r in music.received if r["path"] == "/api/v1/generate"]
    submitted = [r["body"] for r in of(ids.values(), submits, lambda r: r["body"]["callBackUrl"])]
    assert sorted(body["style"] for body in submitted) == sorted(str(b.genre) for b in BRIEFS.values())
    callbacks = [signed_path(body["callBackUrl"], running.base_url) for body in submitted]
    assert sorted(callbacks) == sorted(f"/v1/provider-callbacks/song/{p}" for p in ids.values())
    render_requests = [r for r in render.received if r["path"] == "/v2/renders"]
    renders = [r["body"] for r in of(ids.values(), render_requests, lambda r: r["body"]["metadata"])]
    assert sorted(body["metadata"] for body in renders) == sorted(f"castad-{p}-0-1" for p in ids.values())
    songs = [signed_path(body["modifications"]["Music.source"], running.base_url) for body in renders]
    assert sorted(songs) == sorted(f"/v1/links/pipelines/{p}/artifacts/song" for p in ids.values())
    assert {sent["status"] for sent in of(ids.values(), music.callbacks + render.callbacks, lambda c: c["url"])} == {
        204
    }
    for song in {body["modifications"]["Music.source"] for body in renders}:  # what the render API fetches
        fetched = httpx.get(song)
        assert fetched.status_code == 200 and fetched.headers["content-type"] == "audio/mpeg"
        assert httpx.get(song.replace("expires=", "expires=1")).status_code in (401, 422)


@pytest.mark.timeout(120)
def test_a_rate_limit_costs_no_attempt_and_a_failed_song_is_made_again(network, dbs):
    running, (_, music, _) = network
    music.script(suno.Reply("code", code=430))  # "call frequency too high" on the first submit
    music.plan(suno.Plan(outcome="fail"))  # the first song fails at the provider

    pipeline_id = running.submit(BRIEFS[next(iter(BRIEFS))])
    view = running.wait_terminal([pipeline_id], timeout_s=60)[pipeline_id]

    assert view.status == "SUCCEEDED"
    assert job_attempts(dbs, "song", pipeline_id) == ["interrupted", "failed_retryable", "succeeded"]
    [job] = dbs.jobs_of("song", [pipeline_id])
    assert job["counted_attempts"] == 2  # the failed song and the good one; the rate limit cost nothing
    throttled = dbs.scalar("song", sa.text("SELECT throttled FROM quotas WHERE provider = 'suno'"))
    assert throttled == 1
    submits = [r for r in music.received if r["path"] == "/api/v1/generate"]
    assert len(of([pipeline_id], submits, lambda r: r["body"]["callBackUrl"])) == 3
    [first, second, third] = dbs.attempts_of("song", job["id"])
    assert (first["error_code"], second["error_code"]) == (codes.ErrorCode.PROVIDER_RATE_LIMITED, "provider_job_failed")
    # Each submit is on its attempt's row (the refused one too: it left). The rate limit cost no attempt, so
    # the next one sent the same work under the same key; the failed song made the third a new attempt.
    keys = [f"castad-{pipeline_id}-0-1", f"castad-{pipeline_id}-0-1", f"castad-{pipeline_id}-0-2"]
    assert [a["submission_key"] for a in (first, second, third)] == keys
    assert None not in [a["submitted_at"] for a in (first, second, third)]
