"""The artifact store: content-addressed final names, so a published description stays true."""

from __future__ import annotations

import errno
import hashlib
import os
import pathlib
import stat
import uuid

import boto3
import pytest
from castad_contracts import brief, events
from castad_runtime import artifacts, outages
from castad_runtime.artifacts import s3, volume

PIPELINE = "pipeline-1"
STAGE = events.Stage.VIDEO


def kept(store: volume.VolumeStore, attempt: int, content: bytes) -> events.Artifact:
    with store.scratch(PIPELINE, STAGE, attempt, ".mp4") as scratch:
        scratch.write_bytes(content)
        return store.keep(scratch, PIPELINE, STAGE, "video/mp4")


def place(root: pathlib.Path, pipeline_id: str = PIPELINE, stage: events.Stage = STAGE) -> pathlib.Path:
    """The folder of a stage's files of a pipeline: in the stage's own place."""
    return root / stage.value / pipeline_id


def visible_names(store: volume.VolumeStore) -> list[str]:
    return sorted(path.name for path in place(store.root).iterdir() if not path.name.startswith("."))


def test_a_final_name_is_the_stage_and_the_first_16_hex_of_the_sha256(tmp_path: pathlib.Path) -> None:
    store = volume.VolumeStore(tmp_path)

    artifact = kept(store, 1, b"frames")

    digest = hashlib.sha256(b"frames").hexdigest()
    assert store.path(artifact) == place(tmp_path.resolve()) / f"video-{digest[:16]}.mp4"
    assert (artifact.sha256, artifact.size, artifact.media_type) == (digest, len(b"frames"), "video/mp4")


def test_a_late_keep_of_other_bytes_leaves_the_published_file_as_described(tmp_path: pathlib.Path) -> None:
    store = volume.VolumeStore(tmp_path)
    published = kept(store, 2, b"the attempt that won")

    late = kept(store, 1, b"an abandoned attempt, finishing late")

    assert late.uri != published.uri
    for artifact, content in ((published, b"the attempt that won"), (late, b"an abandoned attempt, finishing late")):
        path = store.path(artifact)
        assert path.read_bytes() == content
        assert path.stat().st_size == artifact.size == len(content)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == artifact.sha256
    assert len(visible_names(store)) == 2


def test_keeps_of_the_same_bytes_share_one_file(tmp_path: pathlib.Path) -> None:
    store = volume.VolumeStore(tmp_path)

    first = kept(store, 1, b"same bytes")
    second = kept(store, 2, b"same bytes")

    assert second == first
    assert store.path(first).read_bytes() == b"same bytes"
    assert visible_names(store) == [store.path(first).name]
    assert list(place(tmp_path).glob(".*")) == []


def test_an_attempt_that_fails_or_is_abandoned_leaves_no_scratch_file(tmp_path: pathlib.Path) -> None:
    store = volume.VolumeStore(tmp_path)
    try:
        with store.scratch(PIPELINE, STAGE, 1, ".mp4") as scratch:
            scratch.write_bytes(b"half a video")
            raise RuntimeError("the render failed")
    except RuntimeError:
        pass
    # A worker killed mid-write leaves its file; the next attempt of the stage clears it.
    left = place(tmp_path) / ".video.attempt2.mp4"
    left.write_bytes(b"from a killed worker")
    other_stage = place(tmp_path, stage=events.Stage.SONG) / ".song.attempt1.wav"
    other_stage.parent.mkdir(parents=True)
    other_stage.write_bytes(b"still being written")

    artifact = kept(store, 3, b"the real video")

    assert [path.name for path in place(tmp_path).iterdir()] == [store.path(artifact).name]
    assert other_stage.read_bytes() == b"still being written"  # in the song stage's place, not the video's


def test_an_attempts_second_scratch_file_leaves_its_first_and_clears_what_an_earlier_one_left(tmp_path: pathlib.Path):
    """A video and its poster: the poster's scratch file is made while the video's is still to be kept."""
    store = volume.VolumeStore(tmp_path)
    with store.scratch(PIPELINE, STAGE, 4, ".mp4") as video:
        video.write_bytes(b"the video")
        (place(tmp_path) / ".video.attempt3.jpg").write_bytes(b"a killed worker's poster")
        (place(tmp_path) / ".video.attempt4.jpg").write_bytes(b"a killed worker's poster, this attempt's number")
        with store.scratch(PIPELINE, STAGE, 4, ".jpg") as poster:
            assert video.read_bytes() == b"the video" and not poster.exists()
            assert sorted(path.name for path in place(tmp_path).glob(".*")) == [".video.attempt4.mp4"]
            poster.write_bytes(b"the poster")
            kept_poster = store.keep(poster, PIPELINE, STAGE, "image/jpeg")
        kept_video = store.keep(video, PIPELINE, STAGE, "video/mp4")

    assert sorted(path.name for path in place(tmp_path).iterdir()) == sorted(
        store.path(artifact).name for artifact in (kept_video, kept_poster)
    )


def test_deleting_a_stages_files_keeps_the_others_and_the_folder_goes_with_the_last_one(tmp_path: pathlib.Path) -> None:
    store = volume.VolumeStore(tmp_path)
    pipeline_id = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"
    for stage, content in ((events.Stage.SONG, b"song"), (events.Stage.SONG, b"late song"), (STAGE, b"video")):
        with store.scratch(pipeline_id, stage, 1, ".bin") as scratch:
            scratch.write_bytes(content)
            store.keep(scratch, pipeline_id, stage, "application/octet-stream")
    (place(tmp_path, pipeline_id, events.Stage.SONG) / ".song.attempt3.wav").write_bytes(b"left by a killed worker")
    # A file of the layout before (up to 0.2), in the pipeline's folder, goes with the stage's other files.
    (tmp_path / pipeline_id).mkdir()
    (tmp_path / pipeline_id / f"song-{_digest(b'older song')}.bin").write_bytes(b"older song")

    assert store.delete(pipeline_id, events.Stage.SONG) == 3
    assert not place(tmp_path, pipeline_id, events.Stage.SONG).exists() and not (tmp_path / pipeline_id).exists()
    assert [path.name for path in place(tmp_path, pipeline_id).iterdir()] == [f"video-{_digest(b'video')}.bin"]
    assert store.delete(pipeline_id, STAGE) == 1
    assert not place(tmp_path, pipeline_id).exists() and (tmp_path / STAGE.value).is_dir()
    assert store.delete(pipeline_id, STAGE) == 0  # twice is harmless


def test_deleting_refuses_anything_but_a_pipeline_id(tmp_path: pathlib.Path) -> None:
    store = volume.VolumeStore(tmp_path / "artifacts")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "video-1.mp4").write_bytes(b"not the store's")

    for wrong in ("../elsewhere", "*", "6F1C2B9E-3D4A-4C5B-9E8F-0A1B2C3D4E5F"):
        with pytest.raises(ValueError, match="not a pipeline id"):
            store.delete(wrong, STAGE)
    assert (tmp_path / "elsewhere" / "video-1.mp4").exists()


def _digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()[:16]


OWN = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"
OTHER = "0b9e8f1c-2d3a-4c5b-8e7f-6a5b4c3d2e1f"


def test_a_file_is_served_and_read_only_from_its_own_pipelines_and_stages_place(tmp_path: pathlib.Path) -> None:
    """An event names its artifact by URI.

    Whoever wrote the event could name any file of the store. A file is served (and read by a later stage) only
    from `<stage>/<pipeline id>/<stage>-…`, the place of the pipeline and stage asked for.
    """
    store = volume.VolumeStore(tmp_path)
    with store.scratch(OWN, events.Stage.SONG, 1, ".wav") as scratch:
        scratch.write_bytes(b"the song")
        song = store.keep(scratch, OWN, events.Stage.SONG, "audio/wav")
    scratch_path = place(tmp_path, OWN, events.Stage.SONG) / ".song.attempt1.wav"
    scratch_path.write_bytes(b"a scratch file, no final one")
    scratch_file = song.model_copy(update={"uri": scratch_path.as_uri()})

    assert store.serve(song, OWN, events.Stage.SONG).read_bytes() == b"the song"
    with store.local_copy(song, OWN, events.Stage.SONG) as copy:
        assert copy.read_bytes() == b"the song"
    for pipeline_id, stage, artifact in (
        (OTHER, events.Stage.SONG, song),  # another pipeline's event naming this file
        (OWN, events.Stage.VIDEO, song),  # the video stage's event naming the song
        (OWN, events.Stage.SONG, scratch_file),
    ):
        with pytest.raises(artifacts.ArtifactMisplaced, match="not a file of"):
            store.serve(artifact, pipeline_id, stage)
        with pytest.raises(artifacts.ArtifactMisplaced), store.local_copy(artifact, pipeline_id, stage):
            pass


def test_a_file_another_stage_changed_on_the_volume_is_not_read_as_the_artifact(tmp_path: pathlib.Path) -> None:
    """Every stage mounts the volume: the video stage reads the song only with the bytes its event recorded."""
    store = volume.VolumeStore(tmp_path)
    with store.scratch(OWN, events.Stage.SONG, 1, ".wav") as scratch:
        scratch.write_bytes(b"the song")
        song = store.keep(scratch, OWN, events.Stage.SONG, "audio/wav")
    store.path(song).write_bytes(b"the gong")  # as another stage with the volume could

    with (
        pytest.raises(artifacts.ArtifactMissing, match="no longer has the bytes"),
        store.local_copy(song, OWN, events.Stage.SONG),
    ):
        pass


def test_an_object_is_presigned_only_from_its_own_pipelines_and_stages_place(tmp_path: pathlib.Path) -> None:
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    store = s3.S3Store(client, "media", "castad/", tmp_path, presign_s=60)
    song = events.Artifact(
        uri=f"s3://media/castad/song/{OWN}/song-0123456789abcdef.wav", sha256="0" * 64, size=1, media_type="audio/wav"
    )

    assert f"castad/song/{OWN}/song-0123456789abcdef.wav?" in store.serve(song, OWN, events.Stage.SONG)
    for pipeline_id, stage, uri in (
        (OTHER, events.Stage.SONG, song.uri),
        (OWN, events.Stage.VIDEO, song.uri),
        (OWN, events.Stage.SONG, f"s3://media/castad/song/{OWN}/song-x/../../../song/{OTHER}/song-0.wav"),
        (OWN, events.Stage.SONG, f"s3://media/castad/video/{OWN}/song-0123456789abcdef.wav"),
    ):
        with pytest.raises(artifacts.ArtifactMisplaced, match="not a file of"):
            store.serve(song.model_copy(update={"uri": uri}), pipeline_id, stage)


def test_a_tenants_image_is_named_by_its_bytes_under_its_owners_place_and_kept_once(tmp_path: pathlib.Path) -> None:
    store = volume.VolumeStore(tmp_path)

    first = store.keep_image(b"\xff\xd8 photo", "hana", "image/jpeg")
    again = store.keep_image(b"\xff\xd8 photo", "hana", "image/jpeg")
    other = store.keep_image(b"\xff\xd8 photo", "../mina", "image/jpeg")

    digest = hashlib.sha256(b"\xff\xd8 photo").hexdigest()
    assert first == again and (first.sha256, first.size, first.media_type) == (digest, 8, "image/jpeg")
    path = store.path(first)
    assert path.name == f"{digest}.jpg" and path.parent.parent == tmp_path / "images"
    assert store.path(other).parent != path.parent and store.path(other).is_relative_to(tmp_path / "images")
    assert sorted(p.name for p in (tmp_path / "images").rglob("*")) == sorted(
        [path.parent.name, store.path(other).parent.name, path.name, path.name]
    )  # no temporary file is left beside them


def test_a_photo_a_brief_names_is_read_from_its_owners_place_with_its_bytes_checked(tmp_path: pathlib.Path) -> None:
    store = volume.VolumeStore(tmp_path)
    kept = store.keep_image(b"\xff\xd8 photo", "hana", "image/jpeg")
    owner = artifacts.image_owner("hana")
    photo = brief.Photo(id=str(uuid.uuid4()), owner=owner, sha256=kept.sha256, media_type="image/jpeg", size=8)

    with store.image_copy(photo) as path:
        assert path.read_bytes() == b"\xff\xd8 photo"
    assert store.serve_image(photo) == store.path(kept)
    with pytest.raises(artifacts.ArtifactMissing):
        store.serve_image(photo.model_copy(update={"owner": artifacts.image_owner("mina")}))
    for other in ({"owner": artifacts.image_owner("mina")}, {"sha256": "0" * 64}, {"media_type": "image/png"}):
        with pytest.raises(artifacts.ArtifactMissing), store.image_copy(photo.model_copy(update=other)):
            pass
    store.path(kept).write_bytes(b"changed")
    with pytest.raises(artifacts.ArtifactMissing), store.image_copy(photo):
        pass


def test_a_kept_image_gets_the_mode_of_every_artifact_and_is_on_disk_before_it_takes_its_name(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = volume.VolumeStore(tmp_path)
    video = kept(store, 1, b"frames")  # written as the stages write theirs
    synced: set[int] = set()
    named: list[bool] = []
    fsync, replace = os.fsync, os.replace

    def recorded_fsync(fd: int) -> None:
        synced.add(os.fstat(fd).st_ino)
        fsync(fd)

    def recorded_replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        named.append(os.stat(source).st_ino in synced)
        replace(source, target)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "replace", recorded_replace)

    image = store.keep_image(b"\xff\xd8 photo", "hana", "image/jpeg")

    assert stat.S_IMODE(store.path(image).stat().st_mode) == stat.S_IMODE(store.path(video).stat().st_mode)
    assert named == [True]


@pytest.mark.parametrize("failing", ["mkdir", "fsync", "replace"])
def test_a_volume_that_refuses_an_image_is_the_store_unavailable_and_leaves_no_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    store = volume.VolumeStore(tmp_path)

    def refused(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC if failing == "fsync" else errno.EROFS, "refused")

    monkeypatch.setattr(pathlib.Path if failing == "mkdir" else os, failing, refused)

    with pytest.raises(outages.StoreUnavailable, match="keep an image in"):
        store.keep_image(b"\xff\xd8 photo", "hana", "image/jpeg")
    assert [path for path in tmp_path.rglob("*") if path.is_file()] == []


def test_a_fetched_file_is_the_pipelines_found_by_its_url_unless_its_bytes_changed_and_deleted_with_it(
    tmp_path: pathlib.Path,
) -> None:
    store = volume.VolumeStore(tmp_path)
    pipeline, url = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f", "https://photos.example.com/hall.png"
    with store.fetched_copy(pipeline, events.Stage.VIDEO, url) as nothing:
        assert nothing is None

    kept = store.keep_fetched(b"\x89PNG hall", pipeline, events.Stage.VIDEO, url, "image/png")

    path = store.path(kept)
    assert path.parent == place(tmp_path, pipeline) and path.name.startswith("video-") and path.suffix == ".png"
    assert path.stem.endswith(kept.sha256[:16]) and kept.size == 9
    with store.fetched_copy(pipeline, events.Stage.VIDEO, url) as found:
        assert found == artifacts.Fetched(path, kept)
    with store.fetched_copy(pipeline, events.Stage.VIDEO, url + "?v=2") as other:
        assert other is None  # another URL's
    path.write_bytes(b"other bytes")
    with store.fetched_copy(pipeline, events.Stage.VIDEO, url) as changed:
        assert changed is None
    (place(tmp_path, pipeline) / ".upload-0123").write_bytes(b"half")  # a write its process did not live to finish
    assert store.delete(pipeline, events.Stage.VIDEO) == 1 and not place(tmp_path, pipeline).exists()


def test_a_part_an_attempt_made_is_found_again_by_its_key_unless_its_bytes_changed_and_deleted_with_the_stage(
    tmp_path: pathlib.Path,
) -> None:
    store = volume.VolumeStore(tmp_path)
    pipeline = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"
    assert store.made(pipeline, events.Stage.VIDEO, "1x1 video", "video/mp4") is None
    with store.scratch(pipeline, events.Stage.VIDEO, 1, ".1x1.mp4") as scratch:
        scratch.write_bytes(b"a square video")
        kept = store.keep(scratch, pipeline, events.Stage.VIDEO, "video/mp4", made_as="1x1 video")

    path = store.path(kept)
    assert path.parent == place(tmp_path, pipeline) and path.name.startswith("video-") and path.suffix == ".mp4"
    assert path.stem.endswith(kept.sha256[:16]) and (kept.size, kept.media_type) == (14, "video/mp4")
    assert store.made(pipeline, events.Stage.VIDEO, "1x1 video", "video/mp4") == kept
    assert store.made(pipeline, events.Stage.VIDEO, "16x9 video", "video/mp4") is None  # another part's key
    assert store.made(pipeline, events.Stage.SONG, "1x1 video", "video/mp4") is None  # another stage's
    path.write_bytes(b"other bytes")
    assert store.made(pipeline, events.Stage.VIDEO, "1x1 video", "video/mp4") is None
    assert store.delete(pipeline, events.Stage.VIDEO) == 1 and not place(tmp_path, pipeline).exists()


def test_a_file_of_the_layout_before_is_read_where_its_event_names_it_then_in_its_stages_place_once_moved(
    tmp_path: pathlib.Path,
) -> None:
    """Releases up to 0.2 kept each stage's files in the pipeline's folder: an event written then names that path."""
    store = volume.VolumeStore(tmp_path)
    older = tmp_path / OWN / f"song-{_digest(b'an older song')}.wav"
    older.parent.mkdir()
    older.write_bytes(b"an older song")
    (tmp_path / OWN / ".song.attempt2.wav").write_bytes(b"left by a killed worker of that release")
    song = events.Artifact(
        uri=older.as_uri(), sha256=hashlib.sha256(b"an older song").hexdigest(), size=13, media_type="audio/wav"
    )
    image = store.keep_image(b"\xff\xd8 photo", "hana", "image/jpeg")
    newer = kept(store, 1, b"frames")
    assert store.serve(song, OWN, events.Stage.SONG) == older.resolve()

    assert store.relayout() == 1
    assert store.relayout() == 0  # once is enough; again is harmless

    moved = place(tmp_path.resolve(), OWN, events.Stage.SONG) / older.name
    assert not (tmp_path / OWN).exists() and moved.read_bytes() == b"an older song"
    assert store.serve(song, OWN, events.Stage.SONG) == moved
    with store.local_copy(song, OWN, events.Stage.SONG) as copy:
        assert copy.read_bytes() == b"an older song"
    for pipeline_id, stage in ((OTHER, events.Stage.SONG), (OWN, events.Stage.VIDEO)):
        with pytest.raises(artifacts.ArtifactMisplaced):
            store.serve(song, pipeline_id, stage)
    assert store.path(image).read_bytes() == b"\xff\xd8 photo" and store.path(newer).read_bytes() == b"frames"


@pytest.mark.parametrize("stage", list(events.Stage))
def test_a_stage_writes_and_deletes_only_in_its_own_place(tmp_path: pathlib.Path, stage: events.Stage) -> None:
    """What lets a deployment give each stage its own place alone to write (its own volume path or bucket prefix)."""
    root = tmp_path / "artifacts"
    others = {other: root / other.value / OWN / f"{other.value}-0123456789abcdef.bin" for other in events.Stage}
    for path in others.values():
        path.parent.mkdir(parents=True)
        path.write_bytes(b"another stage's")
    before = {path for path in root.rglob("*")}
    store = volume.VolumeStore(root)

    with store.scratch(OWN, stage, 1, ".bin") as scratch:
        scratch.write_bytes(b"made")
        store.keep(scratch, OWN, stage, "application/octet-stream")
    store.keep_fetched(b"\x89PNG hall", OWN, stage, "https://example.com/hall.png", "image/png")
    written = {path for path in root.rglob("*")} - before
    store.delete(OWN, stage)

    assert written and all(path.is_relative_to(root / stage.value) for path in written)
    assert [other for other, path in others.items() if not path.exists()] == [stage]


def test_a_file_of_the_layout_before_is_not_found_through_a_link_out_of_its_stages_place(
    tmp_path: pathlib.Path,
) -> None:
    """Its moved name is judged where it leads, as any other name: a link to another pipeline's place is refused."""
    store = volume.VolumeStore(tmp_path)
    others = place(tmp_path, OTHER, events.Stage.SONG)
    others.mkdir(parents=True)
    (others / "song-0123456789abcdef.wav").write_bytes(b"another tenant's song")
    place(tmp_path, OWN, events.Stage.SONG).symlink_to(others)  # as a stage that may write its place could
    named = events.Artifact(
        uri=(tmp_path / OWN / "song-0123456789abcdef.wav").as_uri(), sha256="0" * 64, size=21, media_type="audio/wav"
    )

    with pytest.raises(artifacts.ArtifactMisplaced):
        store.serve(named, OWN, events.Stage.SONG)
