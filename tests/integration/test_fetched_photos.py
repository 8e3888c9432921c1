"""The photos a brief names by URL as the video stage fetched and kept them, on the gateway: recorded from
video.completed, listed with the pipeline's files, served to its tenant alone and only from the pipeline's own
video stage place; and a replay of a pipeline's creation answered as it was, whatever became of its images."""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid

import pytest
from castad_api import keys, tables
from castad_contracts import envelope, events
from castad_runtime import db
from castad_runtime.artifacts import volume
from castad_testkit import briefs

from tests.integration.gateway import make_key
from tests.integration.helpers import now
from tests.unit.test_image_uploads import photo

pytestmark = pytest.mark.integration
BRIEF = {"customer_name": "Stay Meomum", "region": "Gunsan"}
SUBMIT_AND_READ = (keys.Scope.SUBMIT, keys.Scope.READ)
URL = "https://photos.example.com/hall.png"
VIDEO = events.Stage.VIDEO


def submit(client, key: str | None = None, **fields):
    body = {**BRIEF, **fields}
    return client.post("/v1/pipelines", json=body, headers={"Idempotency-Key": key or str(uuid.uuid4())})


def completed(gateway, pipeline_id: str, fetched: tuple[events.FetchedPhoto, ...]) -> envelope.Envelope:
    """The pipeline's lyric and song made, then its video, whose completed event tells `fetched`."""
    start = now() - dt.timedelta(minutes=5)
    gateway.run(pipeline_id, events.Stage.LYRIC, start, 1)
    gateway.run(pipeline_id, events.Stage.SONG, start + dt.timedelta(seconds=2), 1)
    gateway.event(pipeline_id, VIDEO, "started", 1, start + dt.timedelta(seconds=4))
    video = events.Artifact(
        uri=f"file:///artifacts/{pipeline_id}/video", sha256="0" * 64, size=1, media_type="video/mp4"
    )
    payload = events.VideoCompleted(
        pipeline_id=pipeline_id,
        stage=VIDEO,
        job_id="job-video",
        attempt=1,
        artifact=video,
        completed_at=start + dt.timedelta(seconds=9),
        brief=briefs.sample(),
        width=144,
        height=256,
        fetched_photos=fetched,
    )
    return envelope.wrap(payload, "video.completed", "/castad/video")


@pytest.mark.parametrize("projected", ["alone", "together"])
def test_a_photo_the_video_stage_fetched_is_listed_with_the_pipelines_files_and_served_to_its_tenant_alone(
    engines, api, gateway, installation, projected
):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    mina = running.client(make_key(engines["api"], "mina", *SUBMIT_AND_READ))
    uploaded = hana.post("/v1/images", content=photo(), headers={"Content-Type": "image/jpeg"}).json()
    pipeline_id = submit(hana, photos=[uploaded["id"], URL]).json()["id"]
    data = photo("PNG", (48, 36))
    kept = volume.VolumeStore(installation.artifacts_dir).keep_fetched(data, pipeline_id, VIDEO, URL, "image/png")
    fetched = events.FetchedPhoto(photo=1, url=URL, file=kept, width=48, height=36)

    env = completed(gateway, pipeline_id, (fetched,))
    if projected == "together":  # with another event in one transaction, as the consumer groups them
        with gateway.together():
            gateway.deliver(env)
    else:
        gateway.deliver(env)

    view = hana.get(f"/v1/pipelines/{pipeline_id}").json()
    assert view["status"] == "SUCCEEDED"
    stages = {stage["stage"]: stage for stage in view["stages"]}
    download = f"/v1/pipelines/{pipeline_id}/artifacts/video/photos/1"
    assert stages["video"]["fetched_photos"] == [
        {
            "photo": 1,
            "url": URL,
            "sha256": kept.sha256,
            "size": len(data),
            "media_type": "image/png",
            "width": 48,
            "height": 36,
            "download": download,
        }
    ]
    assert stages["song"]["fetched_photos"] == [] and stages["lyric"]["fetched_photos"] == []
    assert hana.get("/v1/pipelines").json()["items"][0]["stages"][2]["fetched_photos"][0]["download"] == download
    served = hana.get(download)
    assert served.status_code == 200 and served.headers["content-type"] == "image/png"
    assert hashlib.sha256(served.content).hexdigest() == kept.sha256
    assert f'filename="{pipeline_id}-photo-1.png"' in served.headers["content-disposition"]
    # Another tenant's key: not found, as the pipeline itself is not.
    assert mina.get(download).status_code == 404 and mina.get(f"/v1/pipelines/{pipeline_id}").status_code == 404
    # The upload is not the stage's file (it has its own route), nor is a photo the brief does not have.
    assert "fetched no photos[0]" in hana.get(download.removesuffix("1") + "0").json()["detail"]
    assert hana.get(download.removesuffix("1") + "20").status_code == 422
    # Once retention deleted the stage's files, its photos are gone with its artifact.
    gateway.ended_long_ago(pipeline_id, VIDEO)
    gone = hana.get(download)
    assert gone.status_code == 410 and "photos[1] was deleted by retention" in gone.json()["detail"]


def test_a_fetched_photo_outside_its_pipelines_video_place_is_never_served(engines, api, gateway, installation):
    """Trust no neighbour: whatever an event names, the gateway serves only a file of that pipeline's video stage."""
    running = api()
    hana = running.client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    store = volume.VolumeStore(installation.artifacts_dir)
    neighbour, pipeline_id = (submit(hana, photos=[URL]).json()["id"] for _ in range(2))
    theirs = store.keep_fetched(photo("PNG"), neighbour, VIDEO, URL, "image/png")
    songs = store.keep_fetched(photo("PNG"), pipeline_id, events.Stage.SONG, URL, "image/png")
    named = (
        events.FetchedPhoto(photo=0, url=URL, file=theirs),  # another pipeline's
        events.FetchedPhoto(photo=1, url=URL, file=songs),  # another stage's of its own
    )

    gateway.deliver(completed(gateway, pipeline_id, named))

    for index in (0, 1):
        refused = hana.get(f"/v1/pipelines/{pipeline_id}/artifacts/video/photos/{index}")
        assert refused.status_code == 404 and "is not in this store" in refused.json()["detail"]


def test_a_replayed_creation_answers_its_pipeline_as_it_was_though_an_image_it_names_is_gone(engines, api):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    uploaded = hana.post("/v1/images", content=photo(), headers={"Content-Type": "image/jpeg"}).json()
    key = str(uuid.uuid4())
    first = submit(hana, key, photos=[uploaded["id"], URL])
    assert first.status_code == 202 and first.json()["created"], first.text
    with db.transaction(engines["api"]) as conn:  # the image is deleted since
        conn.execute(tables.images.delete().where(tables.images.c.id == uuid.UUID(uploaded["id"])))

    replayed = submit(hana, key, photos=[uploaded["id"], URL])

    assert replayed.status_code == 202, replayed.text
    assert (replayed.json()["id"], replayed.json()["created"]) == (first.json()["id"], False)
    named = hana.get(f"/v1/pipelines/{first.json()['id']}").json()["brief"]["photos"]
    assert named[0]["id"] == uploaded["id"] and named[1] == {"url": URL}  # the brief as it was stored
    # The same key with another body is still a conflict; a new key names an image that is not there.
    assert submit(hana, key, photos=[uploaded["id"]]).status_code == 409
    refused = submit(hana, photos=[uploaded["id"], URL])
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "photos", 0]
