"""The lyric stage calling an OpenAI-compatible server, every service its own process.

The server is a local one that behaves like the API. Lyrics come from the server, a rate limit waits as long as the
server asks and costs no attempt, a refused key fails the pipeline at once and says why.
"""

from __future__ import annotations

import pytest
from castad_local.fakes.chat import DEFAULT_KEY, FakeChat, Reply
from castad_testkit import briefs

pytestmark = pytest.mark.e2e


@pytest.fixture
def chat():
    with FakeChat() as fake:
        yield fake


def with_chat(chat: FakeChat, key: str = DEFAULT_KEY) -> dict[str, str]:
    return {
        "CASTAD_LYRIC_PROVIDER": "openai",
        "CASTAD_LYRIC_OPENAI_BASE_URL": f"{chat.url}/v1",
        "CASTAD_LYRIC_OPENAI_API_KEY": key,
        "CASTAD_LYRIC_OPENAI_MODEL": "castad-fake",
        "CASTAD_LYRIC_ALLOW_PRIVATE": "true",  # the fake listens on 127.0.0.1, over http
    }


def lyric_attempts(dbs, pipeline_id: str) -> list:
    [job] = dbs.jobs_of("lyric", [pipeline_id])
    return dbs.attempts_of("lyric", job["id"])


@pytest.mark.timeout(120)
def test_lyrics_from_the_server_reach_the_video_and_a_rate_limit_waits_as_asked(castad, dbs, chat):
    running = castad(with_chat(chat))
    chat.script(Reply("status", status=429, retry_after="2"))
    source = briefs.sample("파도책방")

    pipeline_id = running.submit(source)
    view = running.wait_terminal([pipeline_id])[pipeline_id]

    assert view.status == "SUCCEEDED"
    first, second = lyric_attempts(dbs, pipeline_id)
    assert (first["outcome"], first["error_code"]) == ("interrupted", "provider_rate_limited")
    assert (second["started_at"] - first["finished_at"]).total_seconds() >= 2.0  # not the 0.05 s backoff
    assert second["outcome"] == "succeeded"
    assert [body["model"] for body in chat.received] == ["castad-fake", "castad-fake"]
    assert source.customer_name in chat.received[-1]["messages"][-1]["content"]


@pytest.mark.timeout(120)
def test_a_refused_key_fails_the_pipeline_at_once_without_showing_the_key(castad, dbs, chat):
    running = castad(with_chat(chat, key="sk-not-the-right-one"))

    pipeline_id = running.submit(briefs.sample("열쇠없는가게"))
    view = running.wait_terminal([pipeline_id])[pipeline_id]

    assert (view.status, view.error_code) == ("FAILED", "provider_auth")
    [attempt] = lyric_attempts(dbs, pipeline_id)
    assert attempt["outcome"] == "failed" and "not-the-right" not in attempt["error_message"]
    assert view.stages[0].status == "FAILED"
    assert dbs.jobs_of("song", [pipeline_id]) == []  # no later stage started
