"""The object-store artifact store against a real S3-compatible server (moto's server mode).

Content-addressed uploads, checked downloads, presigned links, and an unreachable store told apart from the work's
failures.
"""

from __future__ import annotations

import hashlib
import urllib.parse

import httpx
import pytest
from castad_contracts import brief, events
from castad_runtime import artifacts, outages, settings
from castad_runtime.artifacts import s3

pytestmark = pytest.mark.integration

PIPELINE = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"


@pytest.fixture
def store(object_store, bucket, tmp_path, monkeypatch):
    for name, value in {**object_store.ENV, **object_store.env(bucket), "CASTAD_ARTIFACTS_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CASTAD_ARTIFACTS_S3_PREFIX", "media/")
    made = artifacts.make_store(settings.StoreSettings())
    assert isinstance(made, s3.S3Store)
    return made


def kept(store: s3.S3Store, content: bytes, attempt: int = 1) -> events.Artifact:
    with store.scratch(PIPELINE, events.Stage.SONG, attempt, ".wav") as scratch:
        scratch.write_bytes(content)
        return store.keep(scratch, PIPELINE, events.Stage.SONG, "audio/wav")


def test_an_artifact_is_uploaded_under_its_content_and_described_exactly(store, object_store):
    artifact = kept(store, b"RIFF song bytes")

    digest = hashlib.sha256(b"RIFF song bytes").hexdigest()
    assert artifact.uri == f"s3://{store.bucket}/media/song/{PIPELINE}/song-{digest[:16]}.wav"
    assert (artifact.sha256, artifact.size, artifact.media_type) == (digest, 15, "audio/wav")
    head = object_store.client().head_object(Bucket=store.bucket, Key=artifact.uri.split("/", 3)[3])
    assert (head["ContentType"], head["Metadata"]["sha256"]) == ("audio/wav", digest)
    assert not list(store.scratch_root.rglob(".song.attempt*"))  # the scratch file is gone


def test_a_later_stage_reads_a_checked_copy_and_a_changed_object_is_refused(store, object_store):
    artifact = kept(store, b"the song")

    with store.local_copy(artifact, PIPELINE, events.Stage.SONG) as copy:
        assert copy.read_bytes() == b"the song"
    assert not copy.exists()

    key = artifact.uri.split("/", 3)[3]
    object_store.client().put_object(Bucket=store.bucket, Key=key, Body=b"other bytes")
    with (
        pytest.raises(artifacts.ArtifactMissing, match="no longer has the bytes"),
        store.local_copy(artifact, PIPELINE, events.Stage.SONG),
    ):
        pass


def test_the_gateway_link_is_a_presigned_url_that_serves_the_bytes(store):
    artifact = kept(store, b"video bytes")

    url = store.serve(artifact, PIPELINE, events.Stage.SONG)
    answer = httpx.get(url)

    assert "X-Amz-Signature" in url
    assert (answer.status_code, answer.content, answer.headers["content-type"]) == (200, b"video bytes", "audio/wav")
    assert answer.headers["content-disposition"].startswith("attachment; filename=")


def test_a_presigned_url_is_valid_as_long_as_asked_within_the_week_sigv4_allows(store):
    artifact = kept(store, b"song bytes")

    def expires(url: str) -> str:
        return urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["X-Amz-Expires"][0]

    assert expires(store.serve(artifact, PIPELINE, events.Stage.SONG)) == str(store.presign_s)
    assert expires(store.serve(artifact, PIPELINE, events.Stage.SONG, valid_s=5400.5)) == "5401"
    assert expires(store.serve(artifact, PIPELINE, events.Stage.SONG, valid_s=30 * 86400)) == "604800"
    assert httpx.get(store.serve(artifact, PIPELINE, events.Stage.SONG, valid_s=5400)).content == b"song bytes"


def test_a_file_its_event_calls_a_page_is_presigned_as_an_attachment_of_no_type_a_browser_runs(store):
    """The media type in an event is the stage's word: text/html or SVG from it would run in the bucket's origin."""
    for named in ("text/html", "image/svg+xml"):
        artifact = kept(store, b"<script>alert(1)</script>").model_copy(update={"media_type": named})

        answer = httpx.get(store.serve(artifact, PIPELINE, events.Stage.SONG))

        assert answer.headers["content-type"] == "application/octet-stream"
        assert answer.headers["content-disposition"].startswith("attachment")


def test_an_artifact_of_another_store_or_a_missing_object_is_missing_not_an_outage(store):
    local = events.Artifact(uri="file:///tmp/song.wav", sha256="0" * 64, size=1, media_type="audio/wav")
    absent = local.model_copy(update={"uri": f"s3://{store.bucket}/media/song/{PIPELINE}/song-0.wav"})

    with pytest.raises(artifacts.ArtifactMissing):
        store.serve(local, PIPELINE, events.Stage.SONG)
    with pytest.raises(artifacts.ArtifactMissing), store.local_copy(absent, PIPELINE, events.Stage.SONG):
        pass


def test_an_unreachable_store_is_an_outage_of_the_machinery(tmp_path, monkeypatch, object_store):
    for name, value in {**object_store.env("castad-gone"), "CASTAD_ARTIFACTS_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CASTAD_ARTIFACTS_S3_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    gone = artifacts.make_store(settings.StoreSettings())

    with (
        pytest.raises(outages.StoreUnavailable) as raised,
        gone.scratch(PIPELINE, events.Stage.VIDEO, 1, ".mp4") as scratch,
    ):
        scratch.write_bytes(b"x")
        gone.keep(scratch, PIPELINE, events.Stage.VIDEO, "video/mp4")

    assert outages.is_resource_shortage(raised.value)


def test_the_s3_store_needs_a_bucket(monkeypatch):
    monkeypatch.setenv("CASTAD_ARTIFACTS_STORE", "s3")
    monkeypatch.delenv("CASTAD_ARTIFACTS_S3_BUCKET", raising=False)
    with pytest.raises(ValueError, match="CASTAD_ARTIFACTS_S3_BUCKET"):
        settings.StoreSettings()


def test_a_tenants_image_is_uploaded_under_its_owners_place_named_by_its_bytes(store, object_store):
    image = store.keep_image(b"\x89PNG photo", "hana", "image/png")

    digest = hashlib.sha256(b"\x89PNG photo").hexdigest()
    key = image.uri.split("/", 3)[3]
    assert key.startswith("media/images/") and key.endswith(f"/{digest}.png")
    assert (image.sha256, image.size) == (digest, 10)
    head = object_store.client().head_object(Bucket=store.bucket, Key=key)
    assert (head["ContentType"], head["Metadata"]["sha256"]) == ("image/png", digest)
    assert store.keep_image(b"\x89PNG photo", "mina", "image/png").uri != image.uri


def test_a_photo_a_brief_names_is_downloaded_from_its_owners_place_with_its_bytes_checked(store, object_store):
    kept = store.keep_image(b"\x89PNG photo", "hana", "image/png")
    photo = brief.Photo(
        id=PIPELINE, owner=artifacts.image_owner("hana"), sha256=kept.sha256, media_type="image/png", size=10
    )

    with store.image_copy(photo) as path:
        assert path.read_bytes() == b"\x89PNG photo"
    assert not path.exists()
    served = httpx.get(store.serve_image(photo), timeout=10)
    assert (served.content, served.headers["content-type"]) == (b"\x89PNG photo", "image/png")
    with pytest.raises(artifacts.ArtifactMissing), store.image_copy(photo.model_copy(update={"owner": "0" * 32})):
        pass


def test_a_fetched_file_is_the_pipelines_found_again_by_its_url_and_deleted_with_its_stage(store, object_store):
    url = "https://photos.example.com/hall.png"
    with store.fetched_copy(PIPELINE, events.Stage.VIDEO, url) as nothing:
        assert nothing is None

    kept = store.keep_fetched(b"\x89PNG hall", PIPELINE, events.Stage.VIDEO, url, "image/png")

    key = kept.uri.split("/", 3)[3]
    assert key.startswith(f"media/video/{PIPELINE}/video-") and key.endswith(f"-{kept.sha256[:16]}.png")
    with store.fetched_copy(PIPELINE, events.Stage.VIDEO, url) as found:
        assert found is not None and found.path.read_bytes() == b"\x89PNG hall" and found.artifact == kept
    assert not found.path.exists()
    object_store.client().put_object(Bucket=store.bucket, Key=key, Body=b"other bytes")
    with store.fetched_copy(PIPELINE, events.Stage.VIDEO, url) as changed:
        assert changed is None
    assert store.delete(PIPELINE, events.Stage.VIDEO) == 1


def test_a_part_an_attempt_made_is_found_again_by_its_key_unless_replaced_and_deleted_with_its_stage(
    store, object_store, tmp_path
):
    assert store.made(PIPELINE, events.Stage.VIDEO, "1x1 video", "video/mp4") is None
    with store.scratch(PIPELINE, events.Stage.VIDEO, 1, ".1x1.mp4") as scratch:
        scratch.write_bytes(b"a square video")
        kept = store.keep(scratch, PIPELINE, events.Stage.VIDEO, "video/mp4", made_as="1x1 video")

    key = kept.uri.split("/", 3)[3]
    assert key.startswith(f"media/video/{PIPELINE}/video-") and key.endswith(f"-{kept.sha256[:16]}.mp4")
    assert store.made(PIPELINE, events.Stage.VIDEO, "1x1 video", "video/mp4") == kept
    assert store.made(PIPELINE, events.Stage.VIDEO, "16x9 video", "video/mp4") is None
    object_store.client().put_object(Bucket=store.bucket, Key=key, Body=b"other bytes")  # not as a stage keeps one
    assert store.made(PIPELINE, events.Stage.VIDEO, "1x1 video", "video/mp4") is None
    assert store.delete(PIPELINE, events.Stage.VIDEO) == 1


def test_a_deleted_image_is_gone_from_its_owners_place_alone_and_deleting_it_again_is_harmless(store, object_store):
    hanas, minas = (store.keep_image(b"\x89PNG photo", tenant, "image/png") for tenant in ("hana", "mina"))
    photo = brief.Photo(
        id=PIPELINE, owner=artifacts.image_owner("hana"), sha256=hanas.sha256, media_type="image/png", size=10
    )

    store.delete_image(photo)
    store.delete_image(photo)

    listed = object_store.client().list_objects_v2(Bucket=store.bucket, Prefix="media/images/")
    assert [found["Key"] for found in listed.get("Contents", [])] == [minas.uri.split("/", 3)[3]]


def test_an_object_of_the_layout_before_is_read_where_named_then_in_its_stages_place_once_moved(store, object_store):
    """Releases up to 0.2 kept a stage's objects in the pipeline's folder; `relayout` moves them to the stage's place.

    An event written before names the old key: it is read there, and at the stage's place once moved.
    """
    client = object_store.client()
    digest = hashlib.sha256(b"an older song").hexdigest()
    old_key = f"media/{PIPELINE}/song-{digest[:16]}.wav"
    client.put_object(
        Bucket=store.bucket, Key=old_key, Body=b"an older song", ContentType="audio/wav", Metadata={"sha256": digest}
    )
    client.put_object(Bucket=store.bucket, Key=f"media/{PIPELINE}/.song.attempt1.wav", Body=b"no final file")
    image = store.keep_image(b"\x89PNG photo", "hana", "image/png")
    placed = kept(store, b"a newer song")
    older = events.Artifact(uri=f"s3://{store.bucket}/{old_key}", sha256=digest, size=13, media_type="audio/wav")
    with store.local_copy(older, PIPELINE, events.Stage.SONG) as copy:
        assert copy.read_bytes() == b"an older song"

    assert store.relayout() == 1
    assert store.relayout() == 0

    moved = f"media/song/{PIPELINE}/song-{digest[:16]}.wav"
    head = client.head_object(Bucket=store.bucket, Key=moved)
    assert (head["ContentType"], head["Metadata"]["sha256"]) == ("audio/wav", digest)
    with store.local_copy(older, PIPELINE, events.Stage.SONG) as copy:
        assert copy.read_bytes() == b"an older song"
    assert httpx.get(store.serve(older, PIPELINE, events.Stage.SONG)).content == b"an older song"
    with pytest.raises(artifacts.ArtifactMisplaced):
        store.serve(older, PIPELINE, events.Stage.VIDEO)
    keys = {found["Key"] for found in client.list_objects_v2(Bucket=store.bucket, Prefix="media/")["Contents"]}
    assert keys == {
        moved,
        placed.uri.split("/", 3)[3],
        image.uri.split("/", 3)[3],
        f"media/{PIPELINE}/.song.attempt1.wav",
    }

    client.copy_object(Bucket=store.bucket, Key=old_key, CopySource={"Bucket": store.bucket, "Key": moved})
    assert store.delete(PIPELINE, events.Stage.SONG) == 3  # its place's two and the layout before's one
