"""The Creatomate video adapter against a local server that behaves like Creatomate's render API (v2).

What it submits, how the stage's submit-then-poll work goes from a render id to a kept MP4, and how every kind of
answer becomes a wait, a result or a classified failure.

The work is the one the video service runs (`make_creatomate_work`), called with hand-built jobs
as the stage runner would claim them: `handle=None` submits, a handle polls.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import io
import json
import pathlib
import threading
import time
import urllib.parse
import uuid
from typing import Any

import pytest
from castad_contracts import brief, codes, events
from castad_local.fakes import creatomate as fake_creatomate
from castad_local.fakes import media
from castad_local.fakes.creatomate import DEFAULT_KEY, FakeCreatomate, Plan
from castad_local.fakes.server import Reply
from castad_runtime import artifacts, links
from castad_runtime.artifacts import volume
from castad_runtime.stage import cancellation, errors, http, machine, outcomes, remote, repository, runner
from castad_video import creatomate, creatomate_template, service
from castad_video.service import VideoSettings, make_creatomate_work
from PIL import Image
from pydantic import SecretStr

from tests.support.links import LINK_SECRET, signed_path, stage_link_secret
from tests.unit.test_video_stage_photos import renders_of

GATEWAY = "http://gateway.test:8000"
TEMPLATE = "tpl-castad-9x16"
SOURCE = brief.Brief(customer_name="바다책방", region="속초", duration_s=20)
LYRICS = events.Lyrics(
    title="파도 소리 책방",
    language=brief.Language.KOREAN,
    sections=(
        events.LyricSection(kind="verse", lines=("속초 바닷가 작은 책방", "파도 소리 들리는 오후")),
        events.LyricSection(kind="chorus", lines=("바다책방에서 만나요",)),
    ),
)
TIMED = (
    events.TimedLine(text="속초 바닷가 작은 책방", start_s=1.0, end_s=4.25),
    events.TimedLine(text="파도 소리 들리는 오후", start_s=4.25, end_s=7.5),
    events.TimedLine(text="바다책방에서 만나요", start_s=7.5, end_s=7.5),  # no time of its own: shown briefly
)
FIRST_S, MAX_S, GIVE_UP_S = 0.1, 1.0, 60.0


@pytest.fixture(scope="module")
def fake():
    with FakeCreatomate(render_s=0.4, templates={TEMPLATE}) as server:
        yield server


def settings_for(fake, **overrides) -> VideoSettings:
    values = {
        "provider": "creatomate",
        "creatomate_base_url": fake.url,
        "allow_private": True,  # the fake is on 127.0.0.1, over http
        "creatomate_api_key": SecretStr(DEFAULT_KEY),
        "creatomate_template_id": TEMPLATE,
        "creatomate_timeout_s": 2.0,
        "gateway_url": GATEWAY,
        "link_secret": stage_link_secret("video"),
        "poll_first_s": FIRST_S,
        "poll_max_s": MAX_S,
        "poll_max_called_back_s": MAX_S,  # a gateway URL is set: the longest wait is the callbacks' safety net
        "provider_give_up_s": GIVE_UP_S,
        **overrides,
    }
    return VideoSettings(**values)


def work_for(fake, **overrides) -> runner.Work:
    return make_creatomate_work(settings_for(fake, **overrides))


def uploaded(artifacts_dir: pathlib.Path, colour: str) -> brief.Photo:
    """A photo of tenant hana's as the gateway kept its upload in the artifact store."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(out, "PNG")
    data = out.getvalue()
    kept = volume.VolumeStore(artifacts_dir).keep_image(data, "hana", "image/png")
    owner = artifacts.image_owner("hana")
    return brief.Photo(id=str(uuid.uuid4()), owner=owner, sha256=kept.sha256, media_type="image/png", size=kept.size)


def song_completed(
    artifacts_dir: pathlib.Path,
    timed: tuple[events.TimedLine, ...] = TIMED,
    photos: tuple[brief.Photo | brief.PhotoLink, ...] = (),
) -> events.SongCompleted:
    """A song.completed whose song is in the artifact store, as the song stage left it."""
    pipeline_id = str(uuid.uuid4())
    song = artifacts_dir / "song" / pipeline_id / "song-0123456789abcdef.mp3"
    song.parent.mkdir(parents=True)
    song.write_bytes(b"ID3 a song")
    return events.SongCompleted(
        pipeline_id=pipeline_id,
        stage=events.Stage.SONG,
        job_id=str(uuid.uuid4()),
        attempt=1,
        artifact=events.Artifact(
            uri=song.as_uri(),
            sha256=hashlib.sha256(song.read_bytes()).hexdigest(),
            size=song.stat().st_size,
            media_type="audio/mpeg",
        ),
        completed_at=dt.datetime.now(dt.UTC),
        # Sealed for the pipeline as the gateway seals them (the stage's key is derived from the tests' root).
        brief=SOURCE.model_copy(update={"photos": links.sealed(SecretStr(LINK_SECRET), pipeline_id, photos)}),
        lyrics=LYRICS,
        timed_lines=timed,
        song_duration_s=9.0,
    )


def job_for(
    done: events.SongCompleted,
    handle: str | None = None,
    polls: int = 0,
    submitted_at: dt.datetime | None = None,
) -> repository.Job:
    if handle is not None and submitted_at is None:
        submitted_at = dt.datetime.now(dt.UTC)
    return repository.Job(
        id=uuid.uuid4(),
        pipeline_id=done.pipeline_id,
        status=machine.Status.RUNNING,
        version=1,
        attempts=1,
        counted_attempts=0,
        max_attempts=5,
        input=done.model_dump(mode="json"),
        traceparent=None,
        tracestate=None,
        handle=handle,
        submitted_at=submitted_at,
        polls=polls,
    )


@pytest.fixture
def job(artifacts_dir) -> repository.Job:
    """A job about to submit its render."""
    return job_for(song_completed(artifacts_dir))


def submitted(work: runner.Work, job: repository.Job, *plans: Plan, fake=None) -> repository.Job:
    """The job after its submit (the fake renders as `plans` say), as the runner would poll it."""
    if plans:
        fake.plan(*plans)
    waiting = work(job, cancellation.Cancellation())
    assert isinstance(waiting, outcomes.Awaiting)
    return dataclasses.replace(job, handle=waiting.handle, submitted_at=dt.datetime.now(dt.UTC))


def poll_until_done(work: runner.Work, job: repository.Job, within_s: float = 10.0) -> outcomes.Output:
    deadline = time.monotonic() + within_s
    while True:
        outcome = work(job, cancellation.Cancellation())
        if isinstance(outcome, outcomes.Output):
            return outcome
        assert time.monotonic() < deadline, "the video was not done in time"
        time.sleep(min(outcome.poll_in_s, 0.1))
        job = dataclasses.replace(job, polls=job.polls + 1)


def failure_once_ended(work: runner.Work, job: repository.Job, within_s: float = 5.0) -> errors.ProviderError:
    """The error of polling work that ended badly at the provider.

    A poll that failed on the way, a reset keep-alive connection say, is only "ask again later", as the runner
    would take it.
    """
    deadline = time.monotonic() + within_s
    while True:
        try:
            outcome = work(job, cancellation.Cancellation())
        except errors.ProviderError as error:
            return error
        assert isinstance(outcome, outcomes.Awaiting) and time.monotonic() < deadline, outcome
        time.sleep(0.05)


def failure(work: runner.Work, job: repository.Job) -> errors.ProviderError:
    with pytest.raises(errors.ProviderError) as caught:
        work(job, cancellation.Cancellation())
    return caught.value


def renders_sent(fake, before: int) -> list[dict]:
    return [r for r in fake.received[before:] if (r["method"], r["path"]) == ("POST", "/v2/renders")]


# --- what is submitted ------------------------------------------------------------------------------------------


def test_submit_sends_the_template_filled_with_the_pipelines_words_song_and_captions(fake, job):
    fake.plan(Plan(outcome="never"))
    before = len(fake.received)

    waiting = work_for(fake)(job, cancellation.Cancellation())

    (request,) = renders_sent(fake, before)
    body = request["body"]
    assert body["template_id"] == TEMPLATE
    song = body["modifications"].pop("Music.source")
    assert signed_path(song, GATEWAY) == f"/v1/links/pipelines/{job.pipeline_id}/artifacts/song"
    assert body["modifications"] == {
        "Title": LYRICS.title,
        "Business": "바다책방",
        "Region": "속초",
        "Caption-1": "속초 바닷가 작은 책방",
        "Caption-1.time": 1.0,
        "Caption-1.duration": 3.25,
        "Caption-2": "파도 소리 들리는 오후",
        "Caption-2.time": 4.25,
        "Caption-2.duration": 3.25,
        "Caption-3": "바다책방에서 만나요",
        "Caption-3.time": 7.5,
        "Caption-3.duration": 0.1,
        # the template's captions past the song's last line are blanked, not left with the template's text
        **{f"Caption-{n}": "" for n in range(4, creatomate_template.MAX_CAPTIONS + 1)},
    }
    assert body["metadata"] == job.submission_key == f"castad-{job.pipeline_id}-0-1"  # tagged with the attempt
    assert signed_path(body["webhook_url"], GATEWAY) == f"/v1/provider-callbacks/video/{job.pipeline_id}"
    assert isinstance(waiting, outcomes.Awaiting)
    assert waiting.poll_in_s == FIRST_S and waiting.throttled_s is None
    polled = work_for(fake)(dataclasses.replace(job, handle=waiting.handle), cancellation.Cancellation())
    assert isinstance(polled, outcomes.Awaiting)  # the handle is the render id the API gave: it knows it
    assert fake.received[-1]["path"] == f"/v2/renders/{waiting.handle}"


def test_the_adapter_sends_no_webhook_without_a_callback_url_and_at_most_sixty_captions(fake, artifacts_dir):
    many = tuple(events.TimedLine(text=f"line {n}", start_s=n, end_s=n + 0.5) for n in range(70))
    done = song_completed(artifacts_dir, many)
    key = http.Credential(SecretStr(DEFAULT_KEY))
    client = http.HttpProvider("the render API", fake.url, 2.0, 100_000, headers=key.bearer, allow_private=True)
    api = creatomate.CreatomateApi(
        client, TEMPLATE, lambda song: f"https://cdn.test/{song.pipeline_id}.mp3", lambda song, begun: ()
    )
    before = len(fake.received)

    handle = api.submit(job_for(done), None, cancellation.Cancellation()).handle

    (request,) = renders_sent(fake, before)
    body = request["body"]
    assert "webhook_url" not in body
    assert body["modifications"]["Music.source"] == f"https://cdn.test/{done.pipeline_id}.mp3"
    captions = [name for name in body["modifications"] if name.startswith("Caption-") and "." not in name]
    assert len(captions) == creatomate_template.MAX_CAPTIONS and "Caption-60" in captions
    assert isinstance(api.poll(handle, cancellation.Cancellation()), remote.Pending)


def test_the_briefs_photos_fill_every_image_element_as_links_the_render_api_may_fetch(fake, artifacts_dir):
    hall, garden = uploaded(artifacts_dir, "red"), uploaded(artifacts_dir, "blue")
    terrace = brief.PhotoLink(url="https://photos.example.com/terrace.jpg")
    job = job_for(song_completed(artifacts_dir, photos=(hall, terrace, garden)))
    fake.plan(Plan(outcome="never"))
    before = len(fake.received)

    waiting = work_for(fake)(job, cancellation.Cancellation())

    (request,) = renders_sent(fake, before)
    sent = {k: v for k, v in request["body"]["modifications"].items() if k.startswith("Photo-")}
    assert list(sent) == [f"Photo-{n}.source" for n in range(1, brief.MAX_PHOTOS + 1)]
    # In the brief's order, then again from the first: no image element keeps the template's own picture.
    paths = [f"/v1/links/pipelines/{job.pipeline_id}/photos/{photo.id}" for photo in (hall, garden)]
    for n, url in enumerate(sent.values()):
        if n % 3 == 1:
            assert url == terrace.url  # named by an https URL: the render API fetches it there
        else:
            assert signed_path(url, GATEWAY) == paths[n % 3 // 2]  # an upload: a link that opens that one image
    assert isinstance(waiting, outcomes.Awaiting) and waiting.notes == ()


def test_a_template_with_fewer_image_elements_shows_the_first_photos_and_one_with_none_fails(artifacts_dir):
    photos = tuple(uploaded(artifacts_dir, colour) for colour in ("red", "green", "blue"))
    five = fake_creatomate.ELEMENTS - {f"Photo-{n}" for n in range(6, 21)}
    with FakeCreatomate(render_s=0.4, templates={TEMPLATE}, elements=five) as odd:
        waiting = work_for(odd)(job_for(song_completed(artifacts_dir, photos=photos)), cancellation.Cancellation())
    assert isinstance(waiting, outcomes.Awaiting)
    assert any("Photo-6" in note for note in waiting.notes)  # warned of, kept on the attempt
    none = fake_creatomate.ELEMENTS - {f"Photo-{n}" for n in range(1, 21)}
    with FakeCreatomate(render_s=0.4, templates={TEMPLATE}, elements=none) as odd:
        error = failure(work_for(odd), job_for(song_completed(artifacts_dir, photos=photos)))
        waiting = work_for(odd)(job_for(song_completed(artifacts_dir)), cancellation.Cancellation())
    assert (error.code, error.retryable) == ("template_mismatch", False) and "Photo-1" in error.message
    assert isinstance(waiting, outcomes.Awaiting)  # without photos the template needs no image element


def test_a_photo_the_render_api_cannot_be_given_fails_the_stage_for_good(fake, artifacts_dir):
    plain = brief.PhotoLink(url="http://photos.example.com/hall.jpg")  # only a test-only setting allows http
    gone = uploaded(artifacts_dir, "red").model_copy(update={"sha256": "0" * 64})
    for photo, code, said in ((plain, "photo_refused", "https URL only"), (gone, "photo_unreachable", "no image")):
        before = len(fake.received)
        error = failure(work_for(fake), job_for(song_completed(artifacts_dir, photos=(photo,))))
        assert (error.code, error.retryable) == (code, False) and said in error.message
        assert renders_sent(fake, before) == []  # nothing was submitted


def test_with_a_bucket_the_render_api_fetches_the_song_and_uploads_at_urls_valid_past_its_give_up_time(
    fake, artifacts_dir
):
    """A render may wait in the provider's queue up to the give-up time: its links must outlive that."""

    class Bucket:
        valid: list[float | None] = []

        def serve(self, artifact: Any, pipeline_id: str, stage: Any, valid_s: float | None = None) -> str:
            self.valid.append(valid_s)
            return "https://bucket.test/media/song.wav?X-Amz-Signature=abc"

        def serve_image(self, photo: brief.Photo, valid_s: float | None = None) -> str:
            self.valid.append(valid_s)
            return f"https://bucket.test/images/{photo.sha256}.png?X-Amz-Signature=abc"

    hall = uploaded(artifacts_dir, "red")
    done = song_completed(artifacts_dir, photos=(hall,))
    config = settings_for(fake)

    song = service.song_url(config, Bucket(), done)  # type: ignore[arg-type]
    urls = service.photo_urls(config, Bucket(), done)  # type: ignore[arg-type]

    assert song == "https://bucket.test/media/song.wav?X-Amz-Signature=abc"
    assert urls == [f"https://bucket.test/images/{hall.sha256}.png?X-Amz-Signature=abc"]
    assert Bucket.valid == [config.provider_give_up_s + links.MARGIN_S] * 2


@pytest.mark.parametrize(
    ("missing", "named"),
    [("Music", "Music"), ("Caption-2", "Caption-2"), ("Title", "Title")],
)
def test_a_template_lacking_an_element_the_video_needs_fails_the_stage_for_good_before_paying(
    artifacts_dir, missing, named
):
    with FakeCreatomate(render_s=0.4, templates={TEMPLATE}, elements=fake_creatomate.ELEMENTS - {missing}) as odd:
        error = failure(work_for(odd), job_for(song_completed(artifacts_dir)))
        assert renders_sent(odd, 0) == []  # found in the template itself: no render paid for
    assert (error.code, error.retryable) == ("template_mismatch", False)
    assert named in error.message


def test_the_templates_elements_are_read_once_then_again_after_a_while_so_an_edit_is_seen(artifacts_dir, monkeypatch):
    with FakeCreatomate(render_s=0.4, templates={TEMPLATE}) as editable:
        work = work_for(editable)
        for _ in range(3):
            assert isinstance(
                work(job_for(song_completed(artifacts_dir)), cancellation.Cancellation()), outcomes.Awaiting
            )
        assert editable.template_reads == 1

        editable.elements = fake_creatomate.ELEMENTS - {"Business"}  # someone edits the template
        monkeypatch.setattr(creatomate, "TEMPLATE_RECHECK_S", 0.0)
        error = failure(work, job_for(song_completed(artifacts_dir)))

    assert (error.code, error.retryable) == ("template_mismatch", False) and "Business" in error.message
    assert len(renders_sent(editable, 0)) == 3


def test_a_template_fixed_since_it_was_read_is_read_again_before_failing_and_one_unreadable_is_taken_as_last_read(
    artifacts_dir, monkeypatch
):
    with FakeCreatomate(render_s=0.4, templates={TEMPLATE}, elements=fake_creatomate.ELEMENTS - {"Title"}) as fixed:
        work = work_for(fixed)
        assert failure(work, job_for(song_completed(artifacts_dir))).code == "template_mismatch"
        fixed.elements = fake_creatomate.ELEMENTS  # the operator fixes it, and retries at once

        waiting = work(job_for(song_completed(artifacts_dir)), cancellation.Cancellation())
        fixed.template_outages = 1  # the next read fails on the way: the last one stands
        monkeypatch.setattr(creatomate, "TEMPLATE_RECHECK_S", 0.0)
        again = work(job_for(song_completed(artifacts_dir)), cancellation.Cancellation())

    assert isinstance(waiting, outcomes.Awaiting) and isinstance(again, outcomes.Awaiting)
    assert len(renders_sent(fixed, 0)) == 2
    assert fixed.template_reads == 4  # once, again before failing; again before failing, found fixed; the outage


def test_errors_in_the_render_answer_fail_the_stage_for_good(fake, job, monkeypatch):
    """Creatomate's answer may carry `errors` with the render it queued: the video would not be what was asked."""
    said = "Source error: the modification 'Music.source' could not be loaded."
    monkeypatch.setattr(FakeCreatomate, "warnings", lambda self, modifications: [])
    original = FakeCreatomate.render

    def with_errors(self, render, status=None):
        return {**original(self, render, status), "errors": [{"message": said}]}

    monkeypatch.setattr(FakeCreatomate, "render", with_errors)
    error = failure(work_for(fake), job)

    assert (error.code, error.retryable) == ("template_mismatch", False)
    assert said in (error.detail or "")


def test_captions_the_template_has_no_element_for_past_the_songs_lines_are_only_warned_of(artifacts_dir, caplog):
    ten = fake_creatomate.ELEMENTS - {f"Caption-{n}" for n in range(11, 61)}  # a template with ten captions
    with FakeCreatomate(render_s=0.4, templates={TEMPLATE}, elements=ten) as odd:
        waiting = work_for(odd)(job_for(song_completed(artifacts_dir)), cancellation.Cancellation())
    assert isinstance(waiting, outcomes.Awaiting)
    assert "Caption-11" in caplog.text and "no element" in caplog.text  # logged for operators
    assert any("Caption-11" in note for note in waiting.notes)  # and kept on the attempt


# --- the work's course: submit, wait, keep ----------------------------------------------------------------------


def test_the_adapter_reports_the_render_at_work_and_then_its_url_and_size(fake, job):
    key = http.Credential(SecretStr(DEFAULT_KEY))
    client = http.HttpProvider("the render API", fake.url, 2.0, 100_000, headers=key.bearer, allow_private=True)
    api = creatomate.CreatomateApi(client, TEMPLATE, lambda song: "https://cdn.test/song.mp3", lambda song, begun: ())
    fake.plan(Plan(seconds=1.5))  # each state half a second: a poll on busy cores may take a fifth of one
    handle = api.submit(job, None, cancellation.Cancellation()).handle
    states = []
    while isinstance(state := api.poll(handle, cancellation.Cancellation()), remote.Pending):
        if not states or states[-1] != state.state:
            states.append(state.state)
        time.sleep(0.02)
    assert states == ["planned", "waiting", "rendering"]
    assert state.url == f"{fake.url}/_fake/renders/{handle}.mp4"
    snapshot = f"{fake.url}/_fake/renders/{handle}.jpg"  # the template sets snapshot_time
    assert state.details == {"width": 360, "height": 640, "duration": 2.0, "snapshot_url": snapshot}


def test_submit_awaits_the_first_poll_and_polls_wait_longer_while_the_render_is_at_work(fake, job):
    work = work_for(fake)
    job = submitted(work, job, Plan(outcome="never"), fake=fake)

    waits = [work(dataclasses.replace(job, polls=polls), cancellation.Cancellation()) for polls in range(7)]

    assert all(isinstance(w, outcomes.Awaiting) and w.handle == job.handle and w.throttled_s is None for w in waits)
    delays = [w.poll_in_s for w in waits]
    assert delays[0] == FIRST_S
    assert all(a < b for a, b in zip(delays[:5], delays[1:6], strict=True))  # growing ...
    assert delays[-1] == MAX_S  # ... up to the longest wait


def test_a_finished_render_is_kept_as_the_mp4_the_api_served_with_its_size(fake, job, artifacts_dir):
    work = work_for(fake, short_side=720)  # the local frame would be 720x1280: the render's size wins
    job = submitted(work, job, Plan(seconds=0.3), fake=fake)

    output = poll_until_done(work, job)

    served = media.mp4()
    artifact = output.artifact
    assert artifact.media_type == "video/mp4"
    assert artifact.size == len(served)
    assert artifact.sha256 == hashlib.sha256(served).hexdigest()
    kept = pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(artifact.uri).path))
    assert kept.is_relative_to(artifacts_dir / "video" / job.pipeline_id) and kept.read_bytes() == served
    assert kept.suffix == ".mp4"
    poster = output.details.pop("poster")  # the render's snapshot, kept as the video's poster
    assert output.details == {
        "width": fake_creatomate.WIDTH,
        "height": fake_creatomate.HEIGHT,
        "duration_s": 9.0,  # the song's, as long as each format's video
        "more_formats": (),
    }
    assert (poster.media_type, poster.sha256) == ("image/jpeg", hashlib.sha256(media.jpeg()).hexdigest())
    assert pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(poster.uri).path)).suffix == ".jpg"


@pytest.mark.parametrize("snapshot", ["none", "gone"])
def test_a_render_without_a_snapshot_or_whose_snapshot_is_gone_is_kept_without_a_poster(fake, job, snapshot):
    """A template without snapshot_time gives none; a snapshot that cannot be fetched costs the video nothing."""
    work = work_for(fake)
    job = submitted(work, job, Plan(seconds=0.3, snapshot=snapshot), fake=fake)

    output = poll_until_done(work, job)

    assert output.artifact.media_type == "video/mp4" and output.details["poster"] is None


# --- failures on the way ----------------------------------------------------------------------------------------


def test_a_rate_limit_on_submit_is_retryable_after_the_retry_after(fake, job):
    fake.script(Reply("status", status=429, retry_after="7"))
    error = failure(work_for(fake), job)
    assert (error.code, error.retryable, error.retry_after_s) == (codes.ErrorCode.PROVIDER_RATE_LIMITED, True, 7.0)


def test_a_rate_limit_on_a_poll_waits_at_least_the_retry_after_and_says_it_was_throttled(fake, job):
    work = work_for(fake)
    job = submitted(work, job, Plan(outcome="never"), fake=fake)
    fake.script(Reply("status", status=429, retry_after="7"))

    waiting = work(job, cancellation.Cancellation())

    assert isinstance(waiting, outcomes.Awaiting)
    assert waiting.handle == job.handle
    assert waiting.poll_in_s >= 7.0 and waiting.throttled_s == 7.0


SLIPS = {
    "5xx": Reply("status", status=502, retry_after="3"),
    "hang": Reply("hang", seconds=1.0),
    "malformed": Reply("malformed"),
    "oversized": Reply("oversized", size=20_000),
}


@pytest.mark.parametrize("reply", SLIPS.values(), ids=SLIPS.keys())
def test_a_poll_that_fails_on_the_way_only_waits_for_the_next_poll(fake, job, reply):
    work = work_for(fake, creatomate_timeout_s=0.3, creatomate_max_answer_bytes=4096)
    job = submitted(work, job, Plan(outcome="never"), fake=fake)
    fake.script(reply)

    started = time.monotonic()
    waiting = work(dataclasses.replace(job, polls=2), cancellation.Cancellation())

    assert isinstance(waiting, outcomes.Awaiting), "the render at the provider must not be given up"
    assert waiting.handle == job.handle
    assert waiting.poll_in_s >= max(FIRST_S * 1.5**2, 3.0 if reply.retry_after else 0.0)
    assert waiting.throttled_s is None
    assert time.monotonic() - started < 0.9


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (Reply("status", status=502), "provider_unavailable"),
        (Reply("hang", seconds=1.0), "provider_timeout"),
        (Reply("malformed"), "provider_malformed"),
        (Reply("oversized", size=20_000), "provider_malformed"),
    ],
    ids=["5xx", "hang", "malformed", "oversized"],
)
def test_a_submit_that_fails_on_the_way_is_a_retryable_error(fake, job, reply, code):
    fake.script(reply)
    error = failure(work_for(fake, creatomate_timeout_s=0.3, creatomate_max_answer_bytes=4096), job)
    assert (error.code, error.retryable) == (code, True)


def test_a_wrong_key_fails_for_good_and_the_key_never_shows(fake, job):
    error = failure(work_for(fake, creatomate_api_key=SecretStr("ck-wrong-key-123456")), job)
    assert (error.code, error.retryable) == ("provider_auth", False)
    assert "ck-wrong" not in error.message


def test_a_template_the_api_does_not_have_fails_for_good_before_any_render(fake, job):
    before = len(fake.received)
    error = failure(work_for(fake, creatomate_template_id="no-such-template"), job)
    assert (error.code, error.retryable) == ("template_mismatch", False)
    assert "no-such-template" in error.message
    assert renders_sent(fake, before) == []


def test_the_apis_hint_is_the_errors_detail_for_operators_not_its_public_message(fake, job):
    fake.script(Reply("status", status=400))
    error = failure(work_for(fake), job)
    assert "Bad Request" in (error.detail or "")
    assert error.message == "the render API answered 400"


def test_a_render_the_api_does_not_know_long_after_its_submit_is_lost_and_a_new_attempt_submits_anew(fake, job):
    submitted_at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=remote.NOT_FOUND_GRACE_S + 1)
    gone = dataclasses.replace(
        job, handle=str(uuid.uuid4()), submitted_at=submitted_at, waited_s=remote.NOT_FOUND_GRACE_S + 1
    )
    error = failure(work_for(fake), gone)
    assert (error.code, error.retryable) == ("provider_job_lost", True)


# --- the provider's work fails, or never ends -------------------------------------------------------------------


def test_a_render_the_api_failed_fails_the_attempt_retryably_with_its_reason(fake, job):
    work = work_for(fake)
    job = submitted(work, job, Plan(outcome="fail", seconds=0.1), fake=fake)
    error = failure_once_ended(work, job)
    assert (error.code, error.retryable) == ("provider_job_failed", True)
    assert fake_creatomate.FAILURE[:40] in (error.detail or "") and error.message == "the render API failed the video"


def test_a_render_canceled_at_the_api_fails_the_stage_for_good_and_is_not_rendered_again(fake, job):
    work = work_for(fake)
    job = submitted(work, job, Plan(outcome="cancelled", seconds=0.1), fake=fake)
    error = failure_once_ended(work, job)
    assert (error.code, error.retryable) == ("provider_job_canceled", False)


def test_a_render_never_done_times_out_once_the_give_up_time_has_passed(fake, job):
    work = work_for(fake)
    job = submitted(work, job, Plan(outcome="never"), fake=fake)
    assert isinstance(work(job, cancellation.Cancellation()), outcomes.Awaiting)  # not yet

    old = dataclasses.replace(job, waited_s=GIVE_UP_S + 1)  # as the claim reads it off the database's clock
    error = failure(work, old)
    assert (error.code, error.retryable) == ("provider_job_timeout", True)


@pytest.mark.parametrize(
    "plan", [Plan(output="wrong_type", seconds=0.1), Plan(output="oversized", size=5000, seconds=0.1)]
)
def test_output_of_the_wrong_type_or_too_large_is_an_invalid_artifact_and_nothing_is_kept(
    fake, job, plan, artifacts_dir
):
    work = work_for(fake, download_max_bytes=4096)
    job = submitted(work, job, plan, fake=fake)
    error = failure_once_ended(work, job)
    assert (error.code, error.retryable) == ("provider_artifact_invalid", True)
    assert not any(path.is_file() for path in (artifacts_dir / "video" / job.pipeline_id).glob("**/*"))


def test_a_video_a_cdn_serves_as_octet_stream_is_kept_as_the_mp4_its_bytes_are(fake, job):
    work = work_for(fake)
    job = submitted(work, job, Plan(output="octet_stream", seconds=0.1), fake=fake)
    output = poll_until_done(work, job)
    assert output.artifact.media_type == "video/mp4"
    assert output.artifact.sha256 == hashlib.sha256(media.mp4()).hexdigest()


# --- cancellation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["submit", "poll"])
def test_a_cancel_ends_a_hanging_request_at_once(fake, job, step):
    work = work_for(fake, creatomate_timeout_s=5.0)
    if step == "poll":
        job = submitted(work, job, Plan(outcome="never"), fake=fake)
    fake.script(Reply("hang", seconds=0.7))
    cancel = cancellation.Cancellation()
    threading.Timer(0.05, cancel.cancel, args=(cancellation.Reason.CANCELED,)).start()
    started = time.monotonic()
    with pytest.raises(cancellation.Cancelled):
        work(job, cancel)
    assert time.monotonic() - started < 0.5


def test_a_song_gone_from_the_store_fails_the_stage_as_unreachable_before_anything_is_submitted(fake, artifacts_dir):
    done = song_completed(artifacts_dir)
    pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(done.artifact.uri).path)).unlink()
    submitted_before = len([r for r in fake.received if r["path"] == "/v2/renders"])

    error = failure(work_for(fake), job_for(done))

    assert (error.code, error.retryable) == ("song_unreachable", False)
    assert len([r for r in fake.received if r["path"] == "/v2/renders"]) == submitted_before


def test_readiness_says_whether_the_template_takes_what_every_video_fills(artifacts_dir):
    with FakeCreatomate(render_s=0.4, templates={TEMPLATE}, elements=fake_creatomate.ELEMENTS - {"Region"}) as odd:
        assert work_for(odd).readiness["template"]() == f"template {TEMPLATE} has no element Region"
        assert work_for(odd, creatomate_template_id="gone").readiness["template"]() == (
            "template gone: the render API has no template gone"
        )
        odd.elements = fake_creatomate.ELEMENTS - {"Photo-3", "Caption-40"}  # fewer photos and captions: fine
        assert work_for(odd).readiness["template"]() == "ok"
        odd.template_outages = 1  # the render API out: not this replica's trouble
        assert work_for(odd).readiness["template"]() == "ok"


# --- several formats --------------------------------------------------------------------------------------------

SQUARE, WIDE = "tpl-castad-1x1", "tpl-castad-16x9"


@pytest.fixture(scope="module")
def formats_fake():
    """The render API with a template of each format's frame: the stage's own (9:16), a square and a wide one."""
    sizes = {SQUARE: (360, 360), WIDE: (640, 360)}
    with FakeCreatomate(render_s=0.3, templates={TEMPLATE, SQUARE, WIDE}, sizes=sizes) as server:
        yield server


def three_formats(artifacts_dir: pathlib.Path) -> repository.Job:
    done = song_completed(artifacts_dir)
    return job_for(done.model_copy(update={"brief": done.brief.model_copy(update={"formats": tuple(brief.Format)})}))


def formats_work(fake, templates: dict[str, str] | None = None) -> runner.Work:
    return work_for(fake, creatomate_format_templates=templates or {"1:1": SQUARE, "16:9": WIDE})


def test_each_format_is_a_render_of_its_own_template_and_kept_with_its_snapshot_the_first_the_stages_own(
    formats_fake, artifacts_dir
):
    work, before = formats_work(formats_fake), len(formats_fake.received)
    job = submitted(work, three_formats(artifacts_dir))

    sent = renders_sent(formats_fake, before)
    assert [body["body"]["template_id"] for body in sent] == [TEMPLATE, SQUARE, WIDE]  # the brief's order
    assert len({json_of(body["body"]["modifications"]) for body in sent}) == 1  # the same words, song and captions
    assert creatomate.format_renders(job.handle) is not None and len(creatomate.format_renders(job.handle)) == 3
    output = poll_until_done(work, job)

    renders = renders_of(output, brief.Format.VERTICAL)
    assert [(render.format, render.width, render.height) for render in renders] == [
        ("9:16", 360, 640),
        ("1:1", 360, 360),
        ("16:9", 640, 360),
    ]
    assert all(render.artifact.media_type == "video/mp4" and render.poster is not None for render in renders)


def json_of(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def test_when_only_some_renders_succeed_the_attempt_fails_and_the_next_renders_only_the_failed_format(
    formats_fake, artifacts_dir
):
    work, before = formats_work(formats_fake), len(formats_fake.received)
    job = submitted(work, three_formats(artifacts_dir), Plan(), Plan(outcome="fail"), Plan(), fake=formats_fake)
    first_renders = dict(creatomate.format_renders(job.handle) or [])

    error = failure_once_ended(work, job)

    assert (error.code, error.retryable) == ("provider_job_failed", True)
    assert error.message == "the render API failed the video (1:1)"
    # The next attempt looks the earlier renders up: the 9:16 and 16:9 ones are kept, only the 1:1 one is asked again.
    again = dataclasses.replace(job, handle=None, previous_handle=job.handle, previous_waited_s=1.0, attempts=2)
    retried = submitted(work, again)
    renders = dict(creatomate.format_renders(retried.handle) or [])
    assert [body["body"]["template_id"] for body in renders_sent(formats_fake, before)] == [
        TEMPLATE,
        SQUARE,
        WIDE,
        SQUARE,
    ]
    assert renders[brief.Format.VERTICAL] == first_renders[brief.Format.VERTICAL]
    assert renders[brief.Format.WIDE] == first_renders[brief.Format.WIDE]
    assert renders[brief.Format.SQUARE] != first_renders[brief.Format.SQUARE]
    output = poll_until_done(work, retried)
    assert [render.format for render in output.details["more_formats"]] == ["1:1", "16:9"]


@pytest.mark.parametrize(
    ("templates", "code", "said"),
    [
        (
            {"16:9": WIDE},
            "format_unsupported",
            "no template of the render API makes 1:1 videos (CASTAD_VIDEO_CREATOMATE_FO",
        ),
        ({"1:1": WIDE, "16:9": WIDE}, "template_mismatch", f"the 1:1 template {WIDE} has a 640x360 frame"),
    ],
    ids=["no-template-for-a-format", "a-template-of-another-shape"],
)
def test_a_format_without_a_template_of_its_shape_fails_the_stage_for_good_before_any_render(
    formats_fake, artifacts_dir, templates, code, said
):
    before = len(formats_fake.received)

    error = failure(formats_work(formats_fake, templates), three_formats(artifacts_dir))

    assert (error.code, error.retryable) == (code, False) and error.message.startswith(said)
    assert renders_sent(formats_fake, before) == []  # nothing paid for a part of what is asked


def test_a_request_that_fails_after_others_were_asked_for_keeps_those_in_the_handle_so_none_is_paid_twice(
    formats_fake, artifacts_dir
):
    work, before = formats_work(formats_fake), len(formats_fake.received)
    formats_fake.script(Reply("ok"), Reply("status", status=503))  # the 9:16 render asked for, then the 1:1 refused

    job = submitted(work, three_formats(artifacts_dir))

    renders = creatomate.format_renders(job.handle) or []
    assert [(shape, render_id == creatomate.UNSENT) for shape, render_id in renders] == [
        ("9:16", False),
        ("1:1", True),
        ("16:9", True),
    ]
    error = failure(work, job)  # its first poll: the formats not asked for are lost, the attempt fails retryably
    assert (error.code, error.retryable) == ("provider_job_failed", True) and "1:1" in error.message
    again = dataclasses.replace(job, handle=None, previous_handle=job.handle, previous_waited_s=1.0, attempts=2)
    retried = submitted(work, again)
    assert dict(creatomate.format_renders(retried.handle) or [])[brief.Format.VERTICAL] == renders[0][1]
    assert [body["body"]["template_id"] for body in renders_sent(formats_fake, before)] == [
        TEMPLATE,
        SQUARE,  # refused
        SQUARE,
        WIDE,
    ]
    assert len(poll_until_done(work, retried).details["more_formats"]) == 2


def test_a_render_still_at_work_past_the_give_up_time_is_asked_for_again_the_others_kept(formats_fake, artifacts_dir):
    work = formats_work(formats_fake)
    job = submitted(work, three_formats(artifacts_dir), Plan(), Plan(outcome="never"), Plan(), fake=formats_fake)
    first = dict(creatomate.format_renders(job.handle) or [])
    time.sleep(0.5)  # the 9:16 and 16:9 renders done (render_s 0.3), the 1:1 one never
    late = dataclasses.replace(
        job, handle=None, previous_handle=job.handle, previous_waited_s=GIVE_UP_S + 1, attempts=2
    )

    retried = submitted(work, late)

    renders = dict(creatomate.format_renders(retried.handle) or [])
    assert renders[brief.Format.VERTICAL] == first[brief.Format.VERTICAL]
    assert renders[brief.Format.WIDE] == first[brief.Format.WIDE]
    assert renders[brief.Format.SQUARE] != first[brief.Format.SQUARE]


def branded(artifacts_dir: pathlib.Path, language: brief.Language, font: brief.FontFamily, logo: bool = True):
    """A job whose brief carries a brand kit (its logo an upload of the tenant's, sealed for the pipeline)."""
    done = song_completed(artifacts_dir)
    mark = links.sealed(SecretStr(LINK_SECRET), done.pipeline_id, (uploaded(artifacts_dir, "magenta"),))[0]
    brand = brief.Brand(logo=mark if logo else None, colors=("#0b3d91", "#ffc20e"), font=font)
    lyrics = done.lyrics.model_copy(update={"language": language})
    return job_for(done.model_copy(update={"brief": done.brief.model_copy(update={"brand": brand}), "lyrics": lyrics}))


@pytest.mark.parametrize(
    ("language", "font", "family"),
    [
        (brief.Language.KOREAN, brief.FontFamily.NANUM_MYEONGJO, "Nanum Myeongjo"),
        (brief.Language.JAPANESE, brief.FontFamily.NOTO_SERIF_CJK, "Noto Serif JP"),
        (brief.Language.JAPANESE, brief.FontFamily.NANUM_GOTHIC, None),  # draws no kana: the template's own font
        (brief.Language.KOREAN, brief.FontFamily.NANUM_SQUARE_ROUND, None),  # not a family the render API has
    ],
)
def test_a_brand_colours_the_names_sets_the_font_of_every_text_and_shows_the_logo_by_a_link(
    fake, artifacts_dir, language, font, family
):
    job = branded(artifacts_dir, language, font)
    fake.plan(Plan(outcome="never"))
    before = len(fake.received)

    waiting = work_for(fake)(job, cancellation.Cancellation())

    (request,) = renders_sent(fake, before)
    sent = request["body"]["modifications"]
    assert (sent["Title.fill_color"], sent["Business.fill_color"], sent["Region.fill_color"]) == (
        "#0b3d91",
        "#0b3d91",
        "#ffc20e",
    )
    fonts = {name: value for name, value in sent.items() if name.endswith(".font_family")}
    texts = ["Title", "Business", "Region", *(f"Caption-{n}" for n in range(1, len(TIMED) + 1))]
    assert fonts == ({f"{name}.font_family": family for name in texts} if family else {})
    logo = job.trigger(events.SongCompleted).brief.brand.logo
    assert signed_path(sent["Logo.source"], GATEWAY) == f"/v1/links/pipelines/{job.pipeline_id}/photos/{logo.id}"
    assert isinstance(waiting, outcomes.Awaiting) and waiting.notes == ()  # every modification names an element


def test_a_template_without_a_logo_element_renders_the_brand_without_its_logo(artifacts_dir, caplog):
    """A tenant's logo cannot fail its pipelines on the operator's template: it is left out, and the log says so."""
    elements = fake_creatomate.ELEMENTS - {"Logo"}
    with FakeCreatomate(render_s=0.2, templates={TEMPLATE}, elements=elements) as server:
        waiting = work_for(server)(
            branded(artifacts_dir, brief.Language.KOREAN, brief.FontFamily.NANUM_GOTHIC), cancellation.Cancellation()
        )

        (request,) = renders_sent(server, 0)
    sent = request["body"]["modifications"]
    assert "Logo.source" not in sent and sent["Business.fill_color"] == "#0b3d91"
    assert isinstance(waiting, outcomes.Awaiting) and waiting.notes == ()
    assert f"template {TEMPLATE} has no Logo element" in caplog.text
