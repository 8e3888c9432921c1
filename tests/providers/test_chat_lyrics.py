"""The Chat Completions lyric provider against a local server that behaves like OpenAI's API.

Every kind of answer it can give, and how each becomes lyrics or a classified failure.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid

import pytest
from castad_contracts import brief, events
from castad_local.fakes.chat import DEFAULT_KEY, FakeChat, Reply
from castad_lyric import chat, provider
from castad_lyric import service as lyric_service
from castad_runtime.stage import cancellation, errors, http, machine, repository
from pydantic import SecretStr

SOURCE = brief.Brief(
    customer_name="바다책방", region="속초", detail_region_info="파도 소리가 들리는 작은 책방", duration_s=20
)


@pytest.fixture(scope="module")
def fake():
    with FakeChat() as server:
        yield server


def client_for(url: str, headers=dict, timeout_s: float = 5.0, max_bytes: int = 100_000) -> http.HttpProvider:
    """A client of the fake, closed after the test (tests/providers/conftest.py)."""
    return http.HttpProvider("the fake", url, timeout_s, max_bytes, headers=headers, allow_private=True)


def provider_for(fake, key: str = DEFAULT_KEY, timeout_s: float = 5.0, max_bytes: int = 100_000, **credential):
    credential = credential or {"value": SecretStr(key)}
    client = client_for(f"{fake.url}/v1", http.Credential(**credential).bearer, timeout_s, max_bytes)
    return chat.ChatLyricProvider(client, "gpt-test")


def failure(fake, *replies: Reply, **options) -> errors.ProviderError:
    fake.script(*replies)
    with pytest.raises(errors.ProviderError) as caught:
        provider_for(fake, **options).write(SOURCE, "p-1", cancellation.Cancellation())
    return caught.value


def test_a_good_answer_becomes_lyrics_in_the_briefs_language_naming_the_business(fake):
    before = len(fake.received)
    lyrics = provider_for(fake).write(SOURCE, "p-1", cancellation.Cancellation())
    again = provider_for(fake).write(SOURCE, "p-1", cancellation.Cancellation())

    assert lyrics.language is brief.Language.KOREAN
    text = "\n".join(lyrics.lines())
    assert SOURCE.customer_name in text and SOURCE.region in text
    first, second = fake.received[before:]
    assert first["model"] == "gpt-test"
    assert first["response_format"]["json_schema"]["strict"] is True
    assert first["seed"] == second["seed"] and lyrics == again  # the same pipeline asks the same way


@pytest.mark.parametrize(
    ("retry_after", "expected"), [("7", 7.0), (None, None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)]
)
def test_a_rate_limit_is_retryable_after_what_the_server_asks(fake, retry_after, expected):
    error = failure(fake, Reply("status", status=429, retry_after=retry_after))
    assert (error.code, error.retryable, error.retry_after_s) == ("provider_rate_limited", True, expected)
    assert "429" in error.message


@pytest.mark.parametrize("status", [500, 502, 503, 408])
def test_a_server_error_is_retryable(fake, status):
    error = failure(fake, Reply("status", status=status, retry_after="3"))
    assert (error.code, error.retryable, error.retry_after_s) == ("provider_unavailable", True, 3.0)


def test_a_wrong_key_fails_for_good_and_the_key_never_shows(fake):
    error = failure(fake, key="sk-wrong-key-123456")
    assert (error.code, error.retryable) == ("provider_auth", False)
    assert "sk-wrong" not in error.message and "401" in error.message


@pytest.mark.parametrize(
    ("status", "code"), [(400, "provider_rejected"), (404, "provider_rejected"), (403, "provider_auth")]
)
def test_a_refused_request_fails_for_good(fake, status, code):
    error = failure(fake, Reply("status", status=status))
    assert (error.code, error.retryable) == (code, False)


@pytest.mark.parametrize(
    ("reply", "code", "retryable"),
    [
        (Reply("refusal"), "content_refused", False),
        (Reply("content_filter"), "content_filtered", False),
        (Reply("length"), "provider_truncated", True),
        (Reply("malformed"), "provider_malformed", True),
        (Reply("oversized", size=200_000), "provider_malformed", True),
    ],
)
def test_an_answer_without_usable_lyrics_is_classified(fake, reply, code, retryable):
    error = failure(fake, reply)
    assert (error.code, error.retryable) == (code, retryable)


def test_no_answer_in_time_is_a_retryable_timeout(fake):
    started = time.monotonic()
    error = failure(fake, Reply("hang", seconds=3), timeout_s=0.5)
    assert (error.code, error.retryable) == ("provider_timeout", True)
    assert time.monotonic() - started < 2.5


def test_an_unreachable_server_is_retryable():
    with FakeChat() as gone:
        url = gone.url
    client = client_for(f"{url}/v1", timeout_s=2.0)
    with pytest.raises(errors.ProviderError) as caught:
        chat.ChatLyricProvider(client, "m").write(SOURCE, "p-1", cancellation.Cancellation())
    assert (caught.value.code, caught.value.retryable) == ("provider_unreachable", True)


def test_a_cancel_ends_a_waiting_call_at_once(fake):
    fake.script(Reply("hang", seconds=3))
    cancel = cancellation.Cancellation()
    threading.Timer(0.3, cancel.cancel, args=(cancellation.Reason.CANCELED,)).start()
    started = time.monotonic()
    with pytest.raises(cancellation.Cancelled):
        provider_for(fake, timeout_s=10).write(SOURCE, "p-1", cancel)
    assert time.monotonic() - started < 1.5


def test_a_key_file_is_read_at_every_call_so_a_rotated_key_is_used(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-first-key\n")
    with FakeChat(api_key="sk-first-key") as rotating:
        writer = provider_for(rotating, file=key_file)
        assert writer.write(SOURCE, "p-1", cancellation.Cancellation()).lines()
        rotating.api_key = "sk-second-key"
        key_file.write_text("sk-second-key")
        assert writer.write(SOURCE, "p-1", cancellation.Cancellation()).lines()


def test_retry_after_reads_seconds_milliseconds_and_dates():
    now = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    assert http.retry_after_s({"retry-after": "12"}, now) == 12.0
    assert http.retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}, now) == 1.5
    assert http.retry_after_s({"retry-after": "Thu, 01 Jan 2026 12:00:30 GMT"}, now) == 30.0
    assert http.retry_after_s({"retry-after": "soon"}, now) is None
    assert http.retry_after_s({}, now) is None


def test_a_retry_after_is_taken_as_an_hour_at_most():
    now = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    assert http.retry_after_s({"retry-after": "99999999999999999999"}, now) == 3600.0
    assert http.retry_after_s({"retry-after": "Fri, 01 Jan 2027 12:00:00 GMT"}, now) == 3600.0


def test_credits_that_ran_out_are_not_a_rate_limit(fake):
    body = json.dumps({"error": {"message": "You exceeded your current quota.", "code": "insufficient_quota"}})
    error = http.classify("the server", 429, {}, body.encode())
    assert (error.code, error.retryable) == ("provider_credits_exhausted", False)
    assert "exceeded your current quota" in (error.detail or "") and error.message == "the server answered 429"


def test_an_answer_cut_off_for_length_is_asked_again_with_twice_the_room_never_the_same_request():
    with FakeChat() as own:  # a server of its own: the module's may still be answering an earlier test's hang
        error = failure(own, Reply("length"))
        lyrics = provider_for(own).write(SOURCE, "p-1", cancellation.Cancellation(), attempt=2)
        cut, whole = own.received

    assert (error.code, error.retryable) == ("provider_truncated", True)
    kinds = provider.structure(SOURCE.duration_s)
    asked = chat.room(len(kinds), provider.lines_per_section(SOURCE.duration_s, len(kinds)))
    assert (cut["max_completion_tokens"], whole["max_completion_tokens"]) == (asked, 2 * asked)
    assert {k: v for k, v in cut.items() if k != "max_completion_tokens"} == {
        k: v for k, v in whole.items() if k != "max_completion_tokens"
    }
    assert SOURCE.customer_name in "\n".join(lyrics.lines())


def test_an_answer_cut_off_with_the_most_room_castad_gives_fails_for_good(monkeypatch):
    """The fake stops an answer at the room the request gives it; with no more room to give, a retry would pay again."""
    monkeypatch.setattr(chat, "MAX_ROOM", 50)  # less than any lyrics take

    with FakeChat() as own:
        error = failure(own)
        [asked] = own.received

    assert (error.code, error.retryable) == ("provider_truncated", False)
    assert "50 tokens" in error.message
    assert asked["max_completion_tokens"] == 50


def test_the_lyric_stage_asks_each_attempt_of_a_job_with_more_room_operator_retries_included(tmp_path, monkeypatch):
    """The room grows with `jobs.attempts`, which an operator's retry does not reset (`counted_attempts` it does)."""
    rooms: list[int] = []

    class Recording:
        def write(self, source, seed, cancel, attempt=1, note=None):
            rooms.append(attempt)
            return events.Lyrics(
                title="t", language=source.language, sections=(events.LyricSection(kind="verse", lines=("a",)),)
            )

    monkeypatch.setattr(lyric_service, "make_writer", lambda config: Recording())
    work = lyric_service.make_work(lyric_service.LyricSettings(artifacts_dir=tmp_path))
    pipeline_id = str(uuid.uuid4())
    request = events.PipelineRequested(pipeline_id=pipeline_id, brief=SOURCE, requested_at=dt.datetime.now(dt.UTC))
    for attempts, counted in ((1, 0), (2, 1), (3, 0)):  # the third after an operator's retry
        job = repository.Job(
            id=uuid.uuid4(),
            pipeline_id=pipeline_id,
            status=machine.Status.RUNNING,
            version=1,
            attempts=attempts,
            counted_attempts=counted,
            max_attempts=5,
            input=request.model_dump(mode="json"),
            traceparent=None,
            tracestate=None,
        )
        work(job, cancellation.Cancellation())

    assert rooms == [1, 2, 3]
