"""The video stage's local renderer shows the photos its brief names.

They are read from the artifact store by their references alone or fetched from their URLs; a photo not there fails
the stage for good.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import pathlib
import threading
import uuid
from http import server

import numpy as np
import pytest
from castad_contracts import brief, events
from castad_runtime import artifacts, links
from castad_runtime.artifacts import volume
from castad_runtime.stage import cancellation, errors, machine, outcomes, repository
from castad_video import provider, service
from PIL import Image, ImageDraw
from pydantic import SecretStr

from tests.unit.test_video_provider import BRIEF, LYRICS, TIMED, as_shown, frame_at, two_photos, write_tone

PIPELINE = "6f1c2b9e-3d4a-4c5b-9e8f-0a1b2c3d4e5f"


# A song that is in no store: for checks made before the song is read.
NOT_STORED = events.Artifact(
    uri=f"file:///srv/castad/song/{PIPELINE}/song-0123456789abcdef.wav", sha256="e" * 64, size=1, media_type="audio/wav"
)


def song_completed(
    store: volume.VolumeStore, tmp_path: pathlib.Path, photos: list[brief.Photo | brief.PhotoLink]
) -> dict:
    with store.scratch(PIPELINE, events.Stage.SONG, 1, ".wav") as scratch:
        write_tone(scratch, 4.0)
        song = store.keep(scratch, PIPELINE, events.Stage.SONG, "audio/wav")
    return song_completed_with(song, photos)


def song_completed_with(song: events.Artifact, photos: list[brief.Photo | brief.PhotoLink]) -> dict:
    """A song.completed as JSON, of `song`, whose brief names `photos`."""
    done = events.SongCompleted(
        pipeline_id=PIPELINE,
        stage=events.Stage.SONG,
        job_id="song-job",
        attempt=1,
        artifact=song,
        completed_at="2026-11-27T12:00:00Z",
        brief=BRIEF.model_copy(update={"photos": tuple(photos)}),
        lyrics=LYRICS,
        timed_lines=TIMED,
        song_duration_s=4.0,
    )
    return done.model_dump(mode="json")


def renders_of(output: outcomes.Output, first: brief.Format) -> list[events.Render]:
    """Every format the stage made, the first (its own artifact, size and poster) in `first`'s shape."""
    details = output.details
    made = events.Render(
        format=first,
        artifact=output.artifact,
        width=details["width"],
        height=details["height"],
        poster=details["poster"],
    )
    return [made, *details["more_formats"]]


def job(input_: dict) -> repository.Job:
    return repository.Job(
        id=uuid.uuid4(),
        pipeline_id=PIPELINE,
        status=machine.Status.RUNNING,
        version=1,
        attempts=1,
        counted_attempts=0,
        max_attempts=3,
        input=input_,
        traceparent=None,
        tracestate=None,
    )


def uploaded(store: volume.VolumeStore, path: pathlib.Path, tenant: str = "hana") -> brief.Photo:
    media_type = "image/jpeg" if path.suffix == ".jpg" else "image/png"
    kept = store.keep_image(path.read_bytes(), tenant, media_type)
    owner = artifacts.image_owner(tenant)
    return brief.Photo(id=str(uuid.uuid4()), owner=owner, sha256=kept.sha256, media_type=media_type, size=kept.size)


@pytest.fixture
def stage(tmp_path: pathlib.Path) -> tuple[volume.VolumeStore, service.runner.Work]:
    # Private addresses allowed: the photo host of a test is on 127.0.0.1.
    # The store's folder goes by the variable's name (a setting every service shares), not by the field's.
    config = service.VideoSettings(
        CASTAD_ARTIFACTS_DIR=tmp_path / "artifacts", short_side=240, fps=6, allow_private=True
    )
    return volume.VolumeStore(config.artifacts_dir), service.make_work(config)


@pytest.fixture
def photo_host(tmp_path: pathlib.Path):
    """An http server on 127.0.0.1 serving the files of the test's folder."""
    handler = functools.partial(server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    served = server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=served.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{served.server_address[1]}"
    served.shutdown()
    served.server_close()
    thread.join()


@pytest.mark.parametrize("second", ["uploaded", "by-url"])
def test_the_local_video_shows_the_photos_the_brief_names_in_turn(stage, tmp_path: pathlib.Path, photo_host, second):
    store, work = stage
    paths = two_photos(tmp_path)
    linked = brief.PhotoLink(url=f"{photo_host}/{paths[1].name}")
    photos = [uploaded(store, paths[0]), uploaded(store, paths[1]) if second == "uploaded" else linked]

    output = work(job(song_completed(store, tmp_path, photos)), cancellation.Cancellation())

    size = (output.details["width"], output.details["height"])
    video = store.path(output.artifact)
    rows = slice(size[1] * 3 // 4, size[1])  # under the caption
    for time_s, shown in ((1.0, 0), (3.0, 1)):
        frame = np.asarray(frame_at(video, time_s, tmp_path / f"at-{time_s}.png"), dtype=np.float64)
        distances = [float(np.mean(np.abs(frame[rows] - as_shown(path, size, 0.5)[rows]))) for path in paths]
        assert distances[shown] < 12 < distances[1 - shown], (time_s, distances)
    fetched = sorted(path.suffix for path in (store.root / "video" / PIPELINE).glob("video-*"))
    # The fetched photo kept as a file of the stage, and the video's poster beside it.
    assert fetched == ([".jpg", ".mp4", ".png"] if second == "by-url" else [".jpg", ".mp4"])
    poster = output.details["poster"]
    assert poster.media_type == "image/jpeg" and store.path(poster).suffix == ".jpg"
    with Image.open(store.path(poster)) as still:
        assert still.size == size
        shown = np.asarray(still.convert("RGB"), dtype=np.float64)
    distances = [float(np.mean(np.abs(shown[rows] - as_shown(path, size, 0.0)[rows]))) for path in paths]
    assert distances[0] < distances[1], distances  # the title card, over the first photo


def test_each_format_the_brief_asks_for_is_a_video_of_its_own_frame_with_its_poster_the_first_the_stages_own(
    stage, tmp_path: pathlib.Path
):
    store, work = stage
    photos = [uploaded(store, two_photos(tmp_path)[0])]
    asked = song_completed(store, tmp_path, photos)
    asked["brief"]["formats"] = ["1:1", "16:9", "9:16"]

    output = work(job(asked), cancellation.Cancellation())

    renders = renders_of(output, brief.Format.SQUARE)
    assert [(render.format, render.width, render.height) for render in renders] == [
        ("1:1", 234, 234),
        ("16:9", 416, 234),
        ("9:16", 234, 416),
    ]
    for render in renders:
        frame = frame_at(store.path(render.artifact), 1.0, tmp_path / f"{render.format.slug}.png")
        assert frame.size == (render.width, render.height)
        assert render.poster is not None
        with Image.open(store.path(render.poster)) as still:
            assert still.size == (render.width, render.height)
    kept = sorted(path.suffix for path in (store.root / "video" / PIPELINE).glob("video-*"))
    assert kept == [".jpg"] * 3 + [".mp4"] * 3
    assert not list((store.root / "video" / PIPELINE).glob(".video.attempt*"))  # no scratch file left


def test_an_attempt_after_one_that_made_some_formats_makes_only_the_others(stage, tmp_path: pathlib.Path, monkeypatch):
    store, work = stage
    asked = song_completed(store, tmp_path, [])
    asked["brief"]["formats"] = ["1:1", "16:9", "9:16"]
    first = work(job(asked), cancellation.Cancellation())
    first_renders = {render.format: render for render in first.details["more_formats"]}
    # The attempt was lost after it kept the 16:9 video and before its poster, say: that format is not whole.
    store.path(first_renders[brief.Format.WIDE].poster).unlink()
    shapes = []
    render = provider.LocalVideoProvider.render

    def counted(self, *args, **kwargs):
        shapes.append(kwargs["shape"])
        return render(self, *args, **kwargs)

    monkeypatch.setattr(provider.LocalVideoProvider, "render", counted)

    second = work(dataclasses.replace(job(asked), attempts=2), cancellation.Cancellation())

    assert shapes == [brief.Format.WIDE]
    assert (second.artifact, second.details["poster"]) == (first.artifact, first.details["poster"])
    again = {render.format: render for render in second.details["more_formats"]}
    assert again[brief.Format.VERTICAL] == first_renders[brief.Format.VERTICAL]
    made = again[brief.Format.WIDE]
    assert made.poster is not None and store.path(made.poster).is_file() and (made.width, made.height) == (416, 234)


def test_a_photo_that_is_not_in_the_store_fails_the_video_for_good(stage, tmp_path: pathlib.Path) -> None:
    store, work = stage
    [path, _] = two_photos(tmp_path)
    photo = uploaded(store, path)
    someone_elses = photo.model_copy(update={"owner": artifacts.image_owner("mina")})

    with pytest.raises(errors.PermanentProviderError) as raised:
        work(job(song_completed(store, tmp_path, [someone_elses])), cancellation.Cancellation())
    assert raised.value.code == "photo_unreachable"


ROOT = SecretStr("the gateway's root link secret, for the seal tests")


def sealed_stage(tmp_path: pathlib.Path, **fields: object) -> tuple[volume.VolumeStore, service.VideoSettings]:
    """A video stage holding its key, derived from the gateway's root, as `python -m castad_api link-secrets` says."""
    config = service.VideoSettings(
        CASTAD_ARTIFACTS_DIR=tmp_path / "artifacts",
        short_side=240,
        fps=6,
        link_secret=links.stage_secret(ROOT, events.Stage.VIDEO),
        **fields,
    )
    return volume.VolumeStore(config.artifacts_dir), config


def test_a_photo_the_gateway_sealed_for_the_pipeline_is_shown(tmp_path: pathlib.Path):
    store, config = sealed_stage(tmp_path)
    [path, _] = two_photos(tmp_path)
    [photo] = links.sealed(ROOT, PIPELINE, (uploaded(store, path),))

    output = service.make_work(config)(job(song_completed(store, tmp_path, [photo])), cancellation.Cancellation())

    assert output.artifact.media_type == "video/mp4"


@pytest.mark.parametrize("forged", ["unsealed", "sealed-for-another-pipeline", "another-tenants-under-its-seal"])
def test_a_photo_the_gateway_did_not_name_for_the_pipeline_fails_the_video_for_good_before_any_use(
    tmp_path: pathlib.Path, forged: str
):
    """What a lyric or song stage could slip into the brief it passes on: refused, whatever the render path."""
    store, config = sealed_stage(tmp_path)
    [path, other] = two_photos(tmp_path)
    own = uploaded(store, path)
    theirs = uploaded(store, other, tenant="mina")
    photo = {
        "unsealed": own,
        "sealed-for-another-pipeline": links.sealed(ROOT, str(uuid.uuid4()), (own,))[0],
        "another-tenants-under-its-seal": theirs.model_copy(
            update={"seal": links.sealed(ROOT, PIPELINE, (own,))[0].seal}
        ),
    }[forged]
    done = song_completed(store, tmp_path, [photo])

    with pytest.raises(errors.PermanentProviderError) as raised:
        service.make_work(config)(job(done), cancellation.Cancellation())
    assert raised.value.code == "photo_not_sealed"
    assert not list((store.root / "video" / PIPELINE).glob("video-*"))  # nothing rendered
    with pytest.raises(errors.PermanentProviderError) as raised:  # a render API is not given it either
        service.photo_urls(config, store, events.SongCompleted.model_validate(done))
    assert raised.value.code == "photo_not_sealed"


def test_an_unsealed_photo_is_used_only_in_a_job_begun_before_the_cut_off_and_a_broken_seal_never(
    tmp_path: pathlib.Path,
):
    """A rollout: jobs of pipelines a gateway of the release before accepted, and their retries, carry no seals."""
    cutoff = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    store, config = sealed_stage(tmp_path, accept_unsealed_photos_before=cutoff)
    [path, _] = two_photos(tmp_path)
    own, link = uploaded(store, path), brief.PhotoLink(url="https://photos.example.com/hall.jpg")
    done = events.SongCompleted.model_validate(song_completed(store, tmp_path, [own, link]))

    assert service.checked_photos(config, done, begun=cutoff - dt.timedelta(seconds=1)) == (own, link)
    for begun in (cutoff, None):  # begun since, or not known: refused
        with pytest.raises(errors.PermanentProviderError, match="photo 1 .* carries no seal"):
            service.checked_photos(config, done, begun=begun)
    broken = done.brief.model_copy(update={"photos": (own.model_copy(update={"seal": "0" * 64}),)})
    with pytest.raises(errors.PermanentProviderError, match="a seal that does not hold"):
        service.checked_photos(config, done.model_copy(update={"brief": broken}), begun=cutoff - dt.timedelta(days=1))


def test_a_photo_named_by_url_is_sealed_too_so_no_stage_can_name_a_url_of_the_store_instead():
    config = service.VideoSettings(link_secret=links.stage_secret(ROOT, events.Stage.VIDEO))
    link = brief.PhotoLink(url="https://bucket.example.com/images/theirs.jpg?X-Amz-Signature=abc")
    [sealed] = links.sealed(ROOT, PIPELINE, (brief.PhotoLink(url="https://photos.example.com/hall.jpg"),))
    done = events.SongCompleted.model_validate(song_completed_with(NOT_STORED, [sealed]))
    assert service.checked_photos(config, done) == (sealed,)
    swapped = done.brief.model_copy(update={"photos": (link.model_copy(update={"seal": sealed.seal}),)})
    with pytest.raises(errors.PermanentProviderError, match=r"photo 1 \(https://bucket.example.com/images/theirs"):
        service.checked_photos(config, done.model_copy(update={"brief": swapped}))


def a_logo(path: pathlib.Path) -> pathlib.Path:
    """A logo as a business uploads one: a magenta disc on a transparent ground."""
    logo = Image.new("RGBA", (120, 120), (0, 0, 0, 0))
    ImageDraw.Draw(logo).ellipse((10, 10, 110, 110), fill=(230, 0, 200, 255))
    logo.save(path)
    return path


def test_the_brands_logo_and_colours_are_in_every_formats_frames_as_its_pipeline_began_with_them(
    tmp_path: pathlib.Path,
):
    store, config = sealed_stage(tmp_path)
    logo = links.sealed(ROOT, PIPELINE, (uploaded(store, a_logo(tmp_path / "logo.png")),))[0]
    asked = song_completed(store, tmp_path, [])
    asked["brief"]["formats"] = ["9:16", "16:9"]
    asked["brief"]["brand"] = {
        "logo": logo.model_dump(mode="json"),
        "colors": ["#1e90ff", "#ffd700"],
        "font": "Noto Serif CJK",
        "caption_style": {"position": "bottom", "size": "large"},
    }

    output = service.make_work(config)(job(asked), cancellation.Cancellation())

    for render in (output.artifact, output.details["more_formats"][0].artifact):
        frame = np.asarray(frame_at(store.path(render), 1.5, tmp_path / "frame.png"), dtype=np.int16)
        height, width = frame.shape[:2]
        corner = frame[height * 3 // 4 :, width * 3 // 4 :].reshape(-1, 3)
        magenta = np.abs(corner - np.array([230, 0, 200])).max(axis=1) < 40
        assert magenta.mean() > 0.05, magenta.mean()  # the logo, in the lower right corner
        top = frame[: height // 10].reshape(-1, 3).mean(axis=0)  # the gradient begins with the brand's main colour
        assert np.abs(top - np.array([30, 144, 255])).max() < 40, top


@pytest.mark.parametrize("forged", ["sealed-for-another-pipeline", "unsealed-in-a-job-before-the-cut-off"])
def test_a_logo_the_gateway_did_not_seal_for_the_pipeline_fails_the_video_for_good(tmp_path: pathlib.Path, forged):
    """No cut-off for a logo: every gateway that names one seals it, so an unsealed logo is a forged one."""
    cutoff = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)  # every job of the test begun before it
    store, config = sealed_stage(tmp_path, accept_unsealed_photos_before=cutoff)
    own = uploaded(store, a_logo(tmp_path / "logo.png"))
    logo = links.sealed(ROOT, str(uuid.uuid4()), (own,))[0] if forged.startswith("sealed") else own
    asked = song_completed(store, tmp_path, [])
    asked["brief"]["brand"] = {"logo": logo.model_dump(mode="json"), "colors": ["#1e90ff"]}

    begun = dataclasses.replace(job(asked), created_at=dt.datetime.now(dt.UTC))

    with pytest.raises(errors.PermanentProviderError) as raised:
        service.make_work(config)(begun, cancellation.Cancellation())

    assert raised.value.code == "photo_not_sealed" and raised.value.message.startswith("the brand's logo (image ")
    assert raised.value.message.endswith("the gateway did not name it for this pipeline")
    assert not list((store.root / "video" / PIPELINE).glob("video-*"))  # nothing rendered
