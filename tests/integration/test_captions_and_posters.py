"""The song's caption files and the video's poster on the gateway.

The sung lines kept from song.completed, listed with the song stage's files once it is made and served as SubRip and
WebVTT; the poster video.completed names, listed with the video and served as the video is; each to the pipeline's
tenant alone, until retention deletes its stage's files."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
import sqlalchemy as sa
from castad_api import keys
from castad_contracts import brief, envelope, events
from castad_runtime import db
from castad_runtime.artifacts import volume
from castad_testkit import briefs

from tests.integration.gateway import LYRICS, make_key
from tests.integration.helpers import now
from tests.unit.test_captions import BREAD, KOREAN
from tests.unit.test_image_uploads import photo

pytestmark = pytest.mark.integration
SONG = events.Stage.SONG


def sung(pipeline_id: str, at: dt.datetime) -> envelope.Envelope:
    payload = events.SongCompleted(
        pipeline_id=pipeline_id,
        stage=SONG,
        job_id="job-song",
        attempt=1,
        artifact=events.Artifact(uri=f"file:///song/{pipeline_id}", sha256="0" * 64, size=1, media_type="audio/wav"),
        completed_at=at,
        brief=briefs.sample(),
        lyrics=LYRICS,
        timed_lines=(BREAD, KOREAN),
        song_duration_s=3663.0,
    )
    return envelope.wrap(payload, "song.completed", "/castad/song")


@pytest.mark.parametrize("projected", ["alone", "together"])
def test_the_songs_lines_are_served_as_subrip_and_webvtt_to_its_tenant_once_it_is_made(
    engines, api, gateway, projected
):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    mina = running.client(make_key(engines["api"], "mina", keys.Scope.READ))
    pipeline_id = hana.post(
        "/v1/pipelines", json={"customer_name": "Cafe Blue", "region": "Busan"}, headers={"Idempotency-Key": "one"}
    ).json()["id"]
    start = now() - dt.timedelta(minutes=5)
    gateway.run(pipeline_id, events.Stage.LYRIC, start, 1)
    gateway.event(pipeline_id, SONG, "started", 1, start + dt.timedelta(seconds=2))
    srt, vtt = (f"/v1/pipelines/{pipeline_id}/artifacts/song/captions.{form}" for form in ("srt", "vtt"))
    before = hana.get(srt)
    assert before.status_code == 404 and "song has no artifact yet" in before.json()["detail"]
    assert all(stage["captions"] == [] for stage in hana.get(f"/v1/pipelines/{pipeline_id}").json()["stages"])

    if projected == "together":  # with another event in one transaction, as the consumer groups them
        with gateway.together():
            gateway.deliver(sung(pipeline_id, start + dt.timedelta(seconds=9)))
    else:
        gateway.deliver(sung(pipeline_id, start + dt.timedelta(seconds=9)))

    stages = {stage["stage"]: stage for stage in hana.get(f"/v1/pipelines/{pipeline_id}").json()["stages"]}
    assert stages["song"]["captions"] == [
        {"format": "srt", "media_type": "application/x-subrip", "download": srt},
        {"format": "vtt", "media_type": "text/vtt", "download": vtt},
    ]
    assert stages["lyric"]["captions"] == [] and stages["video"]["captions"] == []
    subrip, webvtt = hana.get(srt), hana.get(vtt)
    assert subrip.status_code == 200 and subrip.headers["content-type"] == "application/x-subrip; charset=utf-8"
    assert subrip.text.startswith("1\n00:00:01,000 --> 00:00:03,500\nFresh bread & <coffee>\n\n2\n01:01:01,250")
    assert f'filename="{pipeline_id}-song.srt"' in subrip.headers["content-disposition"]
    assert webvtt.status_code == 200 and webvtt.headers["content-type"] == "text/vtt; charset=utf-8"
    assert webvtt.text.endswith("01:01:01.250 --> 01:01:03.000\n군<01:01:01.600>산 <01:01:02.000>한 시간\n\n")
    assert webvtt.headers["x-content-type-options"] == "nosniff"
    # Another tenant's key: not found, as the pipeline itself is not; a format the gateway does not make: 422.
    assert mina.get(vtt).status_code == 404
    assert hana.get(vtt.replace(".vtt", ".ass")).status_code == 422
    # Once retention deleted the song, its captions are gone with it.
    gateway.ended_long_ago(pipeline_id, SONG)
    gone = hana.get(srt)
    assert gone.status_code == 410 and "deleted by retention" in gone.json()["detail"]


def test_the_videos_poster_is_listed_with_it_and_served_to_its_tenant_alone(engines, api, gateway, installation):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    mina = running.client(make_key(engines["api"], "mina", keys.Scope.READ))
    with_poster, without = (gateway.create(tenant="hana") for _ in range(2))
    store = volume.VolumeStore(installation.artifacts_dir)
    still = photo("JPEG", (72, 128))
    with store.scratch(with_poster, events.Stage.VIDEO, 1, ".jpg") as scratch:
        scratch.write_bytes(still)
        poster = store.keep(scratch, with_poster, events.Stage.VIDEO, "image/jpeg")
    start = now() - dt.timedelta(minutes=5)
    for pipeline_id in (with_poster, without):
        gateway.run(pipeline_id, events.Stage.LYRIC, start, 1)
        gateway.run(pipeline_id, SONG, start + dt.timedelta(seconds=2), 1)
        gateway.event(pipeline_id, events.Stage.VIDEO, "started", 1, start + dt.timedelta(seconds=4))
    gateway.deliver(videoed(gateway, with_poster, start + dt.timedelta(seconds=9), poster))
    gateway.deliver(videoed(gateway, without, start + dt.timedelta(seconds=9), None))

    link = f"/v1/pipelines/{with_poster}/artifacts/video/poster"
    stages = {stage["stage"]: stage for stage in hana.get(f"/v1/pipelines/{with_poster}").json()["stages"]}
    assert stages["video"]["poster"] == {
        "sha256": poster.sha256,
        "size": len(still),
        "media_type": "image/jpeg",
        "download": link,
    }
    assert stages["song"]["poster"] is None and stages["lyric"]["poster"] is None
    served = hana.get(link)
    assert served.status_code == 200 and served.headers["content-type"] == "image/jpeg"
    assert hashlib.sha256(served.content).hexdigest() == poster.sha256
    assert f'filename="{with_poster}-poster.jpg"' in served.headers["content-disposition"]
    assert mina.get(link).status_code == 404
    none = hana.get(f"/v1/pipelines/{without}/artifacts/video/poster")
    assert none.status_code == 404 and "made no poster" in none.json()["detail"]
    assert hana.get(f"/v1/pipelines/{without}").json()["stages"][2]["poster"] is None
    # Once retention deleted the video stage's files, its poster is gone with them.
    gateway.ended_long_ago(with_poster, events.Stage.VIDEO)
    gone = hana.get(link)
    assert gone.status_code == 410 and "poster was deleted by retention" in gone.json()["detail"]


def videoed(gateway, pipeline_id: str, at: dt.datetime, poster: events.Artifact | None) -> envelope.Envelope:
    """video.completed of the pipeline, naming `poster`, written as the video stage writes it."""
    common = {"pipeline_id": pipeline_id, "stage": events.Stage.VIDEO, "job_id": "job-video", "attempt": 1}
    made = gateway.envelope(pipeline_id, events.Stage.VIDEO, "completed", 1, at).payload()
    payload = events.VideoCompleted(**{**made.model_dump(), **common, "completed_at": at, "poster": poster})
    return envelope.wrap(payload, "video.completed", "/castad/video")


def kept(store: volume.VolumeStore, pipeline_id: str, data: bytes, suffix: str, media_type: str) -> events.Artifact:
    with store.scratch(pipeline_id, events.Stage.VIDEO, 1, suffix) as scratch:
        scratch.write_bytes(data)
        return store.keep(scratch, pipeline_id, events.Stage.VIDEO, media_type)


def test_each_format_of_the_video_is_listed_with_its_poster_and_served_to_its_tenant_alone(
    engines, api, gateway, installation
):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    mina = running.client(make_key(engines["api"], "mina", keys.Scope.READ))
    body = {"customer_name": "Cafe Blue", "region": "Busan", "formats": ["1:1", "16:9"]}
    accepted = hana.post("/v1/pipelines", json=body, headers={"Idempotency-Key": "formats"})
    pipeline_id = accepted.json()["id"]
    asked = hana.get(f"/v1/pipelines/{pipeline_id}").json()["brief"]
    assert (asked["formats"], asked["orientation"]) == (["1:1", "16:9"], "vertical")
    store = volume.VolumeStore(installation.artifacts_dir)
    square, wide = (kept(store, pipeline_id, f"{name} video".encode(), ".mp4", "video/mp4") for name in ("sq", "wd"))
    square_still = kept(store, pipeline_id, photo("JPEG", (72, 72)), ".jpg", "image/jpeg")
    start = now() - dt.timedelta(minutes=5)
    gateway.run(pipeline_id, events.Stage.LYRIC, start, 1)
    gateway.run(pipeline_id, SONG, start + dt.timedelta(seconds=2), 1)
    gateway.event(pipeline_id, events.Stage.VIDEO, "started", 1, start + dt.timedelta(seconds=4))
    made = videoed(gateway, pipeline_id, start + dt.timedelta(seconds=9), square_still).payload()
    wide_render = events.Render(format=brief.Format.WIDE, artifact=wide, width=128, height=72)  # made without a poster
    payload = made.model_copy(
        update={
            "brief": made.brief.model_copy(update={"formats": (brief.Format.SQUARE, brief.Format.WIDE)}),
            "artifact": square,
            "width": 72,
            "height": 72,
            "more_formats": (wide_render,),
        }
    )
    gateway.deliver(envelope.wrap(payload, "video.completed", "/castad/video"))

    base = f"/v1/pipelines/{pipeline_id}/artifacts/video/formats"
    video = hana.get(f"/v1/pipelines/{pipeline_id}").json()["stages"][2]
    assert video["formats"] == [
        {
            "format": "1:1",
            "width": 72,
            "height": 72,
            "video": {
                "sha256": square.sha256,
                "size": square.size,
                "media_type": "video/mp4",
                "download": f"{base}/1x1",
            },
            "poster": {
                "sha256": square_still.sha256,
                "size": square_still.size,
                "media_type": "image/jpeg",
                "download": f"{base}/1x1/poster",
            },
        },
        {
            "format": "16:9",
            "width": 128,
            "height": 72,
            "video": {"sha256": wide.sha256, "size": wide.size, "media_type": "video/mp4", "download": f"{base}/16x9"},
            "poster": None,
        },
    ]
    assert video["artifact"]["sha256"] == square.sha256  # the first format is the stage's own file
    for path, artifact, name in (
        (f"{base}/1x1", square, "1x1.mp4"),
        (f"{base}/16x9", wide, "16x9.mp4"),
        (f"{base}/1x1/poster", square_still, "1x1-poster.jpg"),
    ):
        served = hana.get(path)
        assert served.status_code == 200 and served.headers["content-type"] == artifact.media_type
        assert hashlib.sha256(served.content).hexdigest() == artifact.sha256
        assert f'filename="{pipeline_id}-{name}"' in served.headers["content-disposition"]
        assert mina.get(path).status_code == 404  # another tenant's key: as if there were no pipeline
    for path, said in ((f"{base}/9x16", "made no 9:16 video"), (f"{base}/16x9/poster", "made no 16:9 poster")):
        missing = hana.get(path)
        assert missing.status_code == 404 and said in missing.json()["detail"], missing.json()
    assert hana.get(f"{base}/4x5").status_code == 422
    # Once retention deleted the video stage's files, every format is gone with them.
    gateway.ended_long_ago(pipeline_id, events.Stage.VIDEO)
    gone = hana.get(f"{base}/16x9")
    assert gone.status_code == 410 and "16:9 video was deleted by retention" in gone.json()["detail"]
    # A gateway of the release before recorded the video made again, leaving the formats of the one before: none
    # is listed or served as this video's.
    with db.transaction(engines["api"]) as conn:
        conn.execute(
            sa.text(
                "UPDATE pipeline_stages SET artifact = jsonb_set(artifact, '{sha256}', to_jsonb(CAST(:other AS text)))"
                " WHERE pipeline_id = :pipeline AND stage = 'video'"
            ),
            {"other": "f" * 64, "pipeline": pipeline_id},
        )
    assert hana.get(f"/v1/pipelines/{pipeline_id}").json()["stages"][2]["formats"] == []
    assert "made no 16:9 video" in hana.get(f"{base}/16x9").json()["detail"]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            {"formats": ["16:9"], "orientation": "vertical"},
            "begin with 16:9, which is horizontal, but orientation is vertical",
        ),
        ({"formats": ["1:1", "1:1"]}, "names the same format more than once"),
        ({"formats": ["4:5"]}, "Input should be '9:16', '1:1' or '16:9'"),
    ],
)
def test_formats_that_cannot_be_made_as_given_are_refused_with_the_reason(engines, api, body, said):
    hana = api().client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))

    refused = hana.post("/v1/pipelines", json={"customer_name": "Cafe Blue", "region": "Busan", **body})

    assert refused.status_code == 422 and said in refused.text, refused.text
