"""The Suno song adapter against a local server that behaves like sunoapi.org's API (v1).

What it submits, how the stage's submit-then-poll work goes from a handle to a kept MP3, and how every kind of
answer becomes a wait, a result or a classified failure.

The work is the one the song service runs (`make_suno_work`), called with hand-built jobs as the
stage runner would claim them: `handle=None` submits, a handle polls.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import pathlib
import threading
import time
import urllib.parse
import uuid

import pytest
from castad_contracts import brief, codes, events
from castad_local.fakes import media
from castad_local.fakes.suno import DEFAULT_KEY, FakeSuno, Plan, Reply
from castad_runtime.stage import cancellation, errors, http, machine, outcomes, remote, repository, runner
from castad_song import suno
from castad_song.service import SongSettings, make_suno_work
from pydantic import SecretStr

from tests.support.links import signed_path, stage_link_secret

GATEWAY = "http://gateway.test:8000"
GENRE = "lo-fi hip hop, 여름밤 빗소리 & soft synths"  # free text, sent as written
SOURCE = brief.Brief(customer_name="바다책방", region="속초", genre=GENRE, duration_s=20)
LYRICS = events.Lyrics(
    title="파도 소리 책방",
    language=brief.Language.KOREAN,
    sections=(
        events.LyricSection(kind="verse", lines=("속초 바닷가 작은 책방", "파도 소리 들리는 오후")),
        events.LyricSection(kind="chorus", lines=("바다책방에서 만나요", "책 한 권에 바다 한 줄")),
        events.LyricSection(kind="bridge", lines=("노을이 지면 다시 와요",)),
    ),
)
FIRST_S, MAX_S, GIVE_UP_S = 0.1, 1.0, 60.0
AUDIO_S = 2.0


@pytest.fixture(scope="module")
def fake():
    with FakeSuno(song_s=0.4, audio_s=AUDIO_S) as server:
        yield server


def settings_for(fake, **overrides) -> SongSettings:
    values = {
        "provider": "suno",
        "suno_base_url": fake.url,
        "allow_private": True,  # the fake is on 127.0.0.1, over http
        "suno_api_key": SecretStr(DEFAULT_KEY),
        "suno_timeout_s": 2.0,
        "poll_first_s": FIRST_S,
        "poll_max_s": MAX_S,
        "provider_give_up_s": GIVE_UP_S,
        **overrides,
    }
    return SongSettings(**values)


def work_for(fake, **overrides) -> runner.Work:
    return make_suno_work(settings_for(fake, **overrides))


def lyric_completed(pipeline_id: str | None = None) -> events.LyricCompleted:
    return events.LyricCompleted(
        pipeline_id=pipeline_id or str(uuid.uuid4()),
        stage=events.Stage.LYRIC,
        job_id=str(uuid.uuid4()),
        attempt=1,
        artifact=events.Artifact(
            uri="file:///nowhere/lyrics.json", sha256="0" * 64, size=10, media_type="application/json"
        ),
        completed_at=dt.datetime.now(dt.UTC),
        brief=SOURCE,
        lyrics=LYRICS,
    )


def job_for(
    done: events.LyricCompleted | None = None,
    handle: str | None = None,
    polls: int = 0,
    submitted_at: dt.datetime | None = None,
    previous_handle: str | None = None,
) -> repository.Job:
    done = done or lyric_completed()
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
        previous_handle=previous_handle,
    )


def submitted(work: runner.Work, *plans: Plan, fake=None) -> repository.Job:
    """A job whose work the fake has (planned as `plans` say): the job as the runner would poll it."""
    if plans:
        fake.plan(*plans)
    job = job_for()
    waiting = work(job, cancellation.Cancellation())
    assert isinstance(waiting, outcomes.Awaiting)
    return dataclasses.replace(job, handle=waiting.handle, submitted_at=dt.datetime.now(dt.UTC))


def poll_until_done(work: runner.Work, job: repository.Job, within_s: float = 10.0) -> outcomes.Output:
    deadline = time.monotonic() + within_s
    while True:
        outcome = work(job, cancellation.Cancellation())
        if isinstance(outcome, outcomes.Output):
            return outcome
        assert time.monotonic() < deadline, "the song was not done in time"
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


def sent(fake, before: int, path: str = "/api/v1/generate") -> list[dict]:
    return [r for r in fake.received[before:] if r["path"] == path]


# --- what is submitted ------------------------------------------------------------------------------------------


def test_submit_sends_the_lyrics_with_section_tags_the_genre_as_written_the_title_and_a_callback(fake):
    done = lyric_completed()
    fake.plan(Plan(outcome="never"))
    before = len(fake.received)

    work = work_for(fake, gateway_url=GATEWAY, suno_model="V5", link_secret=stage_link_secret("song"))
    waiting = work(job_for(done), cancellation.Cancellation())

    (request,) = sent(fake, before)
    body = request["body"]
    assert request["method"] == "POST"
    assert body["customMode"] is True and body["instrumental"] is False
    assert body["model"] == "V5"
    assert body["prompt"] == (
        "[Verse]\n속초 바닷가 작은 책방\n파도 소리 들리는 오후\n\n"
        "[Chorus]\n바다책방에서 만나요\n책 한 권에 바다 한 줄\n\n"
        "[Bridge]\n노을이 지면 다시 와요"
    )
    assert body["style"] == GENRE
    assert body["title"] == LYRICS.title
    assert signed_path(body["callBackUrl"], GATEWAY) == f"/v1/provider-callbacks/song/{done.pipeline_id}"
    assert isinstance(waiting, outcomes.Awaiting)
    assert waiting.poll_in_s == FIRST_S and waiting.throttled_s is None
    polled = work_for(fake)(job_for(done, handle=waiting.handle), cancellation.Cancellation())
    assert isinstance(polled, outcomes.Awaiting)  # the handle is the task id the API gave: it knows it
    assert fake.received[-1]["query"] == f"taskId={waiting.handle}"


def test_without_a_gateway_a_callback_url_that_never_resolves_is_sent_and_the_poll_decides(fake):
    before = len(fake.received)
    waiting = work_for(fake)(job_for(), cancellation.Cancellation())
    (request,) = sent(fake, before)
    assert isinstance(waiting, outcomes.Awaiting)  # the API requires callBackUrl on every generate
    assert urllib.parse.urlsplit(request["body"]["callBackUrl"]).hostname.endswith(".invalid")


@pytest.mark.parametrize("model", ["V3_5", "V4"])
def test_lyrics_too_long_for_an_older_model_are_cut_at_a_line_to_what_it_takes(fake, model):
    line = "바다책방에서 만나요 책 한 권에 바다 한 줄 " * 3
    many = tuple(events.LyricSection(kind="verse", lines=(line,) * 8) for _ in range(12))
    long = events.Lyrics(title=LYRICS.title, language=brief.Language.KOREAN, sections=many)
    done = lyric_completed().model_copy(update={"lyrics": long})
    before = len(fake.received)

    waiting = work_for(fake, suno_model=model)(job_for(done), cancellation.Cancellation())

    (request,) = sent(fake, before)
    assert isinstance(waiting, outcomes.Awaiting), "the API answers code 413 past the model's limits"
    prompt = request["body"]["prompt"]
    assert len(prompt) <= 3000
    assert prompt.endswith(line) and prompt.startswith("[Verse]\n")  # whole lines, none cut in the middle


def test_an_overlong_title_is_cut_to_what_the_api_takes(fake):
    long = events.Lyrics(title="가" * 100, language=brief.Language.KOREAN, sections=LYRICS.sections)
    done = lyric_completed().model_copy(update={"lyrics": long})
    before = len(fake.received)
    waiting = work_for(fake)(job_for(done), cancellation.Cancellation())
    (request,) = sent(fake, before)
    assert isinstance(waiting, outcomes.Awaiting)  # the fake, like the API, takes at most 80 characters
    assert request["body"]["title"] == "가" * suno.NEWER.title


# --- the work's course: submit, wait, keep ----------------------------------------------------------------------


def test_the_adapter_reports_every_step_of_the_task_and_then_the_first_tracks_mp3(fake):
    key = http.Credential(SecretStr(DEFAULT_KEY))
    client = http.HttpProvider("the music API", fake.url, 2.0, 100_000, headers=key.bearer, allow_private=True)
    api = suno.SunoApi(client, "V4_5")
    fake.plan(Plan(seconds=0.6))
    handle = api.submit(job_for(), None, cancellation.Cancellation()).handle
    states = []
    while isinstance(state := api.poll(handle, cancellation.Cancellation()), remote.Pending):
        if not states or states[-1] != state.state:
            states.append(state.state)
        time.sleep(0.02)
    assert states == ["PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"]  # a streaming first track is not the song yet
    assert state.url == f"{fake.url}/_fake/audio/{handle}/1.mp3"
    assert state.details["duration_s"] == AUDIO_S


def test_submit_awaits_the_first_poll_and_polls_wait_longer_while_the_song_is_at_work(fake):
    work = work_for(fake)
    job = submitted(work, Plan(outcome="never"), fake=fake)

    waits = [work(dataclasses.replace(job, polls=polls), cancellation.Cancellation()) for polls in range(7)]

    assert all(isinstance(w, outcomes.Awaiting) and w.handle == job.handle and w.throttled_s is None for w in waits)
    delays = [w.poll_in_s for w in waits]
    assert delays[0] == FIRST_S
    assert all(a < b for a, b in zip(delays[:5], delays[1:6], strict=True))  # growing ...
    assert delays[-1] == MAX_S  # ... up to the longest wait


def test_a_finished_song_is_kept_as_the_mp3_the_api_served_with_its_lines_spread_over_it(fake, artifacts_dir):
    work = work_for(fake)
    job = submitted(work, Plan(seconds=0.3), fake=fake)

    output = poll_until_done(work, job)

    served = media.mp3(AUDIO_S)
    artifact = output.artifact
    assert artifact.media_type == "audio/mpeg"
    assert artifact.size == len(served)
    assert artifact.sha256 == hashlib.sha256(served).hexdigest()
    kept = pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(artifact.uri).path))
    assert kept.is_relative_to(artifacts_dir / "song" / job.pipeline_id) and kept.read_bytes() == served
    assert output.details["song_duration_s"] == AUDIO_S
    assert output.details["lyrics"] == LYRICS
    timed = output.details["timed_lines"]
    assert [line.text for line in timed] == LYRICS.lines()
    assert timed[0].start_s == pytest.approx(0.05 * AUDIO_S) and timed[-1].end_s == pytest.approx(0.95 * AUDIO_S)
    for earlier, later in zip(timed, timed[1:], strict=False):
        assert earlier.start_s < earlier.end_s == later.start_s
    events.SongCompleted(  # what the service publishes holds together
        pipeline_id=job.pipeline_id,
        stage=events.Stage.SONG,
        job_id=str(job.id),
        attempt=1,
        artifact=artifact,
        completed_at=dt.datetime.now(dt.UTC),
        brief=SOURCE,
        **output.details,
    )


# --- failures on the way ----------------------------------------------------------------------------------------


def test_a_rate_limit_on_submit_is_retryable_after_the_retry_after(fake):
    fake.script(Reply("code", code=430, in_status=True, retry_after="7"))
    error = failure(work_for(fake), job_for())
    assert (error.code, error.retryable, error.retry_after_s) == (codes.ErrorCode.PROVIDER_RATE_LIMITED, True, 7.0)


def test_a_rate_limit_on_a_poll_waits_at_least_the_retry_after_and_says_it_was_throttled(fake):
    work = work_for(fake)
    job = submitted(work, Plan(outcome="never"), fake=fake)
    fake.script(Reply("code", code=430, in_status=True, retry_after="7"))

    waiting = work(job, cancellation.Cancellation())

    assert isinstance(waiting, outcomes.Awaiting)
    assert waiting.handle == job.handle
    assert waiting.poll_in_s >= 7.0 and waiting.throttled_s == 7.0


SLIPS = {
    "5xx": Reply("status", status=503, retry_after="3"),
    "hang": Reply("hang", seconds=1.0),
    "malformed": Reply("malformed"),
    "oversized": Reply("oversized", size=20_000),
    "too frequent": Reply("code", code=430),
    "maintenance": Reply("code", code=455),
}


@pytest.mark.parametrize("reply", SLIPS.values(), ids=SLIPS.keys())
def test_a_poll_that_fails_on_the_way_only_waits_for_the_next_poll(fake, reply):
    work = work_for(fake, suno_timeout_s=0.3, suno_max_answer_bytes=4096)
    job = submitted(work, Plan(outcome="never"), fake=fake)
    fake.script(reply)

    started = time.monotonic()
    waiting = work(dataclasses.replace(job, polls=2), cancellation.Cancellation())

    assert isinstance(waiting, outcomes.Awaiting), "the song at the provider must not be given up"
    assert waiting.handle == job.handle
    assert waiting.poll_in_s >= max(FIRST_S * 1.5**2, 3.0 if reply.retry_after else 0.0)
    assert waiting.throttled_s == (0.0 if reply.code == 430 else None)
    assert time.monotonic() - started < 0.9


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (Reply("status", status=503), "provider_unavailable"),
        (Reply("hang", seconds=1.0), "provider_timeout"),
        (Reply("malformed"), "provider_malformed"),
        (Reply("oversized", size=20_000), "provider_malformed"),
    ],
    ids=["5xx", "hang", "malformed", "oversized"],
)
def test_a_submit_that_fails_on_the_way_is_a_retryable_error(fake, reply, code):
    fake.script(reply)
    error = failure(work_for(fake, suno_timeout_s=0.3, suno_max_answer_bytes=4096), job_for())
    assert (error.code, error.retryable) == (code, True)


@pytest.mark.parametrize(
    ("body_code", "code", "retryable"),
    [
        (430, codes.ErrorCode.PROVIDER_RATE_LIMITED, True),
        (405, codes.ErrorCode.PROVIDER_RATE_LIMITED, True),
        (429, "provider_credits_exhausted", False),
        (455, codes.ErrorCode.PROVIDER_MAINTENANCE, True),
        (500, "provider_unavailable", True),
        (400, "provider_rejected", False),
        (413, "provider_rejected", False),
    ],
)
def test_an_error_code_in_the_body_of_a_submit_is_classified(fake, body_code, code, retryable):
    fake.script(Reply("code", code=body_code))
    error = failure(work_for(fake), job_for())
    assert (error.code, error.retryable) == (code, retryable)
    assert str(body_code) in error.message


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (430, codes.ErrorCode.PROVIDER_RATE_LIMITED, True),
        (405, codes.ErrorCode.PROVIDER_RATE_LIMITED, True),
        (429, "provider_credits_exhausted", False),
        (455, codes.ErrorCode.PROVIDER_MAINTENANCE, True),
        (413, "provider_rejected", False),
        (401, "provider_auth", False),
    ],
)
def test_an_error_code_carried_by_the_http_status_too_means_what_it_means_in_the_body(fake, status, code, retryable):
    fake.script(Reply("code", code=status, in_status=True, retry_after="9"))
    error = failure(work_for(fake), job_for())
    assert (error.code, error.retryable) == (code, retryable)
    if code in (codes.ErrorCode.PROVIDER_RATE_LIMITED, codes.ErrorCode.PROVIDER_MAINTENANCE):
        assert error.retry_after_s == 9.0


def test_maintenance_or_a_rate_limit_in_the_http_status_of_a_poll_only_waits(fake):
    work = work_for(fake)
    job = submitted(work, Plan(outcome="never"), fake=fake)
    for status in (455, 430):
        fake.script(Reply("code", code=status, in_status=True))
        waiting = work(job, cancellation.Cancellation())
        assert isinstance(waiting, outcomes.Awaiting) and waiting.handle == job.handle
        assert waiting.throttled_s == (0.0 if status == 430 else None)


def test_a_bare_429_without_the_apis_answer_is_a_rate_limit_of_something_in_front_of_it():
    error = suno.classify("the music API", 429, {"retry-after": "4"}, b"<html>Too Many Requests</html>")
    assert (error.code, error.retryable, error.retry_after_s) == (codes.ErrorCode.PROVIDER_RATE_LIMITED, True, 4.0)


def test_credits_that_ran_out_fail_a_poll_for_good(fake):
    work = work_for(fake)
    job = submitted(work, Plan(outcome="never"), fake=fake)
    fake.script(Reply("code", code=429))
    error = failure(work, job)
    assert (error.code, error.retryable) == ("provider_credits_exhausted", False)


def test_a_key_refused_on_a_poll_asks_again_later_so_a_rotation_loses_no_song(fake):
    work = work_for(fake)
    job = submitted(work, Plan(outcome="never"), fake=fake)
    fake.script(Reply("code", code=401))
    waiting = work(job, cancellation.Cancellation())
    assert isinstance(waiting, outcomes.Awaiting) and waiting.handle == job.handle


def test_a_wrong_key_fails_for_good_and_the_key_never_shows(fake):
    error = failure(work_for(fake, suno_api_key=SecretStr("sk-wrong-key-123456")), job_for())
    assert (error.code, error.retryable) == ("provider_auth", False)
    assert "sk-wrong" not in error.message


def test_a_task_the_api_does_not_know_long_after_its_submit_is_lost_and_a_new_attempt_submits_anew(fake):
    old = dataclasses.replace(job_for(handle=uuid.uuid4().hex), waited_s=remote.NOT_FOUND_GRACE_S + 1)
    error = failure(work_for(fake), old)
    assert (error.code, error.retryable) == ("provider_job_lost", True)


def test_a_fresh_task_the_api_does_not_list_yet_is_asked_again_and_paid_once():
    """sunoapi.org's users report "not found" for a task polled right after its creation."""
    with FakeSuno(song_s=0.4, audio_s=AUDIO_S, listed_after_s=0.5) as late:
        work = work_for(late)
        job = submitted(work)
        asked = work(job, cancellation.Cancellation())  # at once: not listed yet
        assert isinstance(asked, outcomes.Awaiting) and asked.handle == job.handle

        output = poll_until_done(work, dataclasses.replace(job, polls=1))

        assert output.artifact.media_type == "audio/mpeg"
        assert late.tasks_made == 1
        answers = [r for r in late.received if r["path"] == "/api/v1/generate/record-info"]
        assert len(answers) >= 2


# --- the provider's work fails, or never ends -------------------------------------------------------------------


def test_a_song_the_api_failed_fails_the_attempt_retryably(fake):
    work = work_for(fake)
    job = submitted(work, Plan(outcome="fail", seconds=0.1), fake=fake)
    error = failure_once_ended(work, job)
    assert (error.code, error.retryable) == ("provider_job_failed", True)
    assert "Audio generation failed." in (error.detail or "") and "Audio" not in error.message


def test_a_task_whose_callback_could_not_be_delivered_is_finished_with_its_tracks_not_failed(fake):
    work = work_for(fake, gateway_url=GATEWAY, link_secret=stage_link_secret("song"))
    job = submitted(work, Plan(outcome="callback_exception", seconds=0.2), fake=fake)
    made = fake.tasks_made

    output = poll_until_done(work, job)

    assert output.artifact.media_type == "audio/mpeg"
    assert fake.tasks_made == made  # kept, not submitted again


def test_a_task_whose_callback_failed_before_its_tracks_show_is_still_waited_for(fake):
    data = {"status": "CALLBACK_EXCEPTION", "response": {"sunoData": [{"id": "t", "audioUrl": "", "duration": 3}]}}
    assert isinstance(suno.finished(data), remote.Pending)
    assert isinstance(suno.finished({"status": "CALLBACK_EXCEPTION", "response": None}), remote.Pending)


def test_lyrics_refused_for_sensitive_words_fail_for_good(fake):
    work = work_for(fake)
    job = submitted(work, Plan(outcome="sensitive", seconds=0.3), fake=fake)
    error = failure_once_ended(work, job)
    assert (error.code, error.retryable) == ("content_refused", False)


def test_a_song_never_done_times_out_once_the_give_up_time_has_passed(fake):
    work = work_for(fake)
    job = submitted(work, Plan(outcome="never"), fake=fake)
    assert isinstance(work(job, cancellation.Cancellation()), outcomes.Awaiting)  # not yet

    old = dataclasses.replace(job, waited_s=GIVE_UP_S + 1)  # as the claim reads it off the database's clock
    error = failure(work, old)
    assert (error.code, error.retryable) == ("provider_job_timeout", True)


@pytest.mark.parametrize(
    "plan", [Plan(audio="wrong_type", seconds=0.1), Plan(audio="oversized", size=5000, seconds=0.1)]
)
def test_audio_of_the_wrong_type_or_too_large_is_an_invalid_artifact_and_nothing_is_kept(fake, plan, artifacts_dir):
    work = work_for(fake, download_max_bytes=4096)
    job = submitted(work, plan, fake=fake)
    error = failure_once_ended(work, job)
    assert (error.code, error.retryable) == ("provider_artifact_invalid", True)
    assert not any(path.is_file() for path in artifacts_dir.glob("**/*"))


def test_a_song_a_cdn_serves_as_octet_stream_is_kept_as_the_mp3_its_bytes_are(fake):
    work = work_for(fake)
    job = submitted(work, Plan(audio="octet_stream", seconds=0.1), fake=fake)
    output = poll_until_done(work, job)
    assert output.artifact.media_type == "audio/mpeg"
    assert output.artifact.sha256 == hashlib.sha256(media.mp3(AUDIO_S)).hexdigest()


def test_a_new_attempt_takes_the_song_an_earlier_attempt_left_finished_instead_of_paying_again(fake):
    work = work_for(fake)
    earlier = submitted(work, Plan(seconds=0.1), fake=fake)
    time.sleep(0.2)  # done at the provider, though that attempt failed (its give-up time, a lost download)
    made = fake.tasks_made

    output = work(job_for(handle=None, previous_handle=earlier.handle), cancellation.Cancellation())

    assert isinstance(output, outcomes.Output) and output.artifact.media_type == "audio/mpeg"
    assert fake.tasks_made == made


def test_a_new_attempt_submits_anew_when_the_earlier_song_failed(fake):
    work = work_for(fake)
    earlier = submitted(work, Plan(outcome="fail", seconds=0.05), fake=fake)
    time.sleep(0.1)
    made = fake.tasks_made

    waiting = work(job_for(handle=None, previous_handle=earlier.handle), cancellation.Cancellation())

    assert isinstance(waiting, outcomes.Awaiting) and waiting.handle != earlier.handle
    assert fake.tasks_made == made + 1


# --- cancellation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["submit", "poll"])
def test_a_cancel_ends_a_hanging_request_at_once(fake, step):
    work = work_for(fake, suno_timeout_s=5.0)
    job = job_for() if step == "submit" else submitted(work, Plan(outcome="never"), fake=fake)
    fake.script(Reply("hang", seconds=0.7))
    cancel = cancellation.Cancellation()
    threading.Timer(0.05, cancel.cancel, args=(cancellation.Reason.CANCELED,)).start()
    started = time.monotonic()
    with pytest.raises(cancellation.Cancelled):
        work(job, cancel)
    assert time.monotonic() - started < 0.5
