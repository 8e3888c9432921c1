"""One contract for every network provider's adapter, run against the fake of its API.

What starts work at the API leaves only past the attempt's fence, and what one attempt sends twice is what the real
API makes of it.

Two submits of one attempt happen when a worker's answer is lost with its lease: the worker that claims
the attempt again sends it again, under the same submission key. None of the three APIs takes an
idempotency key or finds a job by a tag of ours (docs/providers.md), so each makes two jobs of them, and
so must its fake: a fake that honoured a key its API ignores would hide the cost. What the fence closes is
the frozen worker, whose lease ran out before its submit: it sends nothing.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from castad_contracts import codes
from castad_local.fakes import chat as fake_chat
from castad_local.fakes import creatomate as fake_creatomate
from castad_local.fakes import suno as fake_suno
from castad_lyric import chat
from castad_runtime import links
from castad_runtime.stage import cancellation, fence, http, outcomes, repository, runner
from pydantic import SecretStr

from tests.providers import test_chat_lyrics, test_creatomate_video, test_suno_song


@dataclasses.dataclass
class Api:
    """An adapter's submit of one attempt, and what the fake of its API received and made of it."""

    fake: Any  # the fake server
    api_key: str
    submit: Callable[[cancellation.Cancellation], str | None]  # the provider's id of the job made, if it says
    path: str  # where a submit goes
    key: str | None  # the attempt's submission key, where the adapter sends it as a tag
    sent: Callable[[], list[dict[str, Any]]]  # the bodies of the submits received

    def raw_submit(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """Send `body` as a client of the API's own might, with `headers`; the job the answer describes."""
        auth = {"authorization": f"Bearer {self.api_key}"}
        answer = httpx.post(f"{self.fake.url}{self.path}", json=body, headers={**auth, **headers}, timeout=5)
        answer.raise_for_status()
        data = answer.json()
        return data.get("data") or data  # the music API wraps its answers in {"code", "msg", "data"}


def bodies(fake: Any, path: str) -> Callable[[], list[dict[str, Any]]]:
    return lambda: [r["body"] for r in fake.received if (r["method"], r["path"]) == ("POST", path)]


def submitting(work: runner.Work, job: repository.Job) -> Callable[[cancellation.Cancellation], str]:
    """A submit-then-poll adapter's submit of `job`: the handle the API gave."""

    def submit(cancel: cancellation.Cancellation) -> str:
        outcome = work(job, cancel)
        assert isinstance(outcome, outcomes.Awaiting)
        return outcome.handle

    return submit


@pytest.fixture(params=["chat", "suno", "creatomate"])
def api(request: pytest.FixtureRequest, artifacts_dir: pathlib.Path) -> Iterator[Api]:
    if request.param == "chat":
        with fake_chat.FakeChat() as chat_fake:
            credential = http.Credential(SecretStr(fake_chat.DEFAULT_KEY))
            client = http.HttpProvider(
                "the fake", f"{chat_fake.url}/v1", 5, 100_000, headers=credential.bearer, allow_private=True
            )
            writer = chat.ChatLyricProvider(client, "gpt-test")

            def write(cancel: cancellation.Cancellation) -> None:
                writer.write(test_chat_lyrics.SOURCE, "p-1", cancel)

            path = "/v1/chat/completions"
            yield Api(chat_fake, fake_chat.DEFAULT_KEY, write, path, None, lambda: list(chat_fake.received))
    elif request.param == "suno":
        with fake_suno.FakeSuno(song_s=3600) as suno_fake:
            work = test_suno_song.work_for(suno_fake)
            job = test_suno_song.job_for()
            path = "/api/v1/generate"
            yield Api(suno_fake, fake_suno.DEFAULT_KEY, submitting(work, job), path, None, bodies(suno_fake, path))
    else:
        templates = {test_creatomate_video.TEMPLATE}
        with fake_creatomate.FakeCreatomate(render_s=3600, templates=templates) as render_fake:
            work = test_creatomate_video.work_for(render_fake)
            job = test_creatomate_video.job_for(test_creatomate_video.song_completed(artifacts_dir))
            path = "/v2/renders"
            submit, key = submitting(work, job), job.submission_key
            yield Api(render_fake, fake_creatomate.DEFAULT_KEY, submit, path, key, bodies(render_fake, path))


def lease_lost() -> None:
    raise fence.Fenced(codes.ErrorCode.LEASE_LOST, "the lease is not known to be held")


def test_a_worker_whose_lease_ran_out_before_its_submit_sends_nothing_to_the_api(api: Api) -> None:
    with pytest.raises(fence.Fenced):
        api.submit(cancellation.Cancellation(before_leaving=lease_lost))

    assert api.sent() == []


def test_one_attempt_submitted_twice_is_two_jobs_at_the_api_for_it_takes_no_key(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the links it signs expire counted from the clock: both submits sign at one second, or the bodies differ
    at = time.time()
    monkeypatch.setattr(links, "time", types.SimpleNamespace(time=lambda: at))
    first = api.submit(cancellation.Cancellation())
    second = api.submit(cancellation.Cancellation())  # claimed again after its answer was lost

    one, two = api.sent()
    assert one == two  # the same work, under the same key
    if first is not None:  # the API names each job it made
        assert first != second
    if api.key is not None:  # the adapter tags the job with the attempt's key: both renders say whose they are
        assert one["metadata"] == two["metadata"] == api.key


def test_the_fake_like_its_api_makes_a_new_job_of_a_submit_that_repeats_an_idempotency_key(api: Api) -> None:
    api.submit(cancellation.Cancellation())
    [body] = api.sent()
    key = {"idempotency-key": "castad-the-same-key"}

    made = [api.raw_submit(body, key) for _ in range(2)]

    ids = [job.get("id") or job.get("taskId") for job in made]
    assert None not in ids and ids[0] != ids[1]
