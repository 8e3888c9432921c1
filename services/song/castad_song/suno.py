"""Songs from a Suno music API, as sunoapi.org publishes it (API v1, docs.sunoapi.org, read 2026-11).

Submit, then poll (castad_runtime.stage.remote):
- `POST /api/v1/generate` with the lyrics as `prompt`, the brief's genre as `style` (as written),
  the title and, when the gateway is reachable, `callBackUrl` → `data.taskId`, the handle;
- `GET /api/v1/generate/record-info?taskId=` → `data.status`: PENDING, TEXT_SUCCESS and
  FIRST_SUCCESS are still at work; SUCCESS brings `data.response.sunoData[]` with each track's
  `audioUrl` and `duration`; SENSITIVE_WORD_ERROR is a refusal; the other *_FAILED a failure.

The API answers errors in the body's `code` as often as in the HTTP status: 400/413 are a
rejected request, 401 a bad key, 405/430 "too frequent" (a rate limit), 429 credits that ran
out (an operator must top them up: not retried), 455/5xx maintenance or trouble (retried).
The first track is kept; its lines are spread over its length (the API does not time them).
"""

from __future__ import annotations

from typing import Any

from castad_contracts import events
from castad_runtime import redact
from castad_runtime.stage import cancellation, errors, http, remote, repository

PENDING = frozenset({"PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"})
FAILED = frozenset({"CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED", "CALLBACK_EXCEPTION"})
MAX_PROMPT = 5000
MAX_STYLE = 1000
MAX_TITLE = 80
TAGS = {"verse": "[Verse]", "chorus": "[Chorus]", "bridge": "[Bridge]"}


def prompt(lyrics: events.Lyrics) -> str:
    """The lyrics as the API sings them: each section under its tag."""
    parts = []
    for section in lyrics.sections:
        parts.append("\n".join((TAGS[section.kind], *section.lines)))
    return "\n\n".join(parts)[:MAX_PROMPT]


def request_body(done: events.LyricCompleted, model: str, callback_url: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "customMode": True,
        "instrumental": False,
        "model": model,
        "prompt": prompt(done.lyrics),
        "style": str(done.brief.genre)[:MAX_STYLE],
        "title": done.lyrics.title[:MAX_TITLE],
    }
    if callback_url:
        body["callBackUrl"] = callback_url
    return body


def data_of(answer: Any) -> dict[str, Any]:
    """The `data` of an answer whose body `code` is 200; a ProviderError for any other code."""
    if not isinstance(answer, dict) or not isinstance(answer.get("code"), int):
        raise errors.ProviderError("provider_malformed", "the music API's answer has no code")
    code, said = answer["code"], redact.mask(str(answer.get("msg") or ""))[:200] or None
    message = f"the music API answered code {code}"  # what it said is the operators' (detail), not the tenant's
    if code == 200:
        data = answer.get("data")
        if not isinstance(data, dict):
            raise errors.ProviderError("provider_malformed", "the music API's answer has no data")
        return data
    if code in (405, 430):
        raise errors.ProviderError(errors.RATE_LIMITED, message, detail=said)
    if code == 401:
        raise errors.ProviderError("provider_auth", message, retryable=False, detail=said)
    if code == 429:
        raise errors.ProviderError("provider_credits_exhausted", message, retryable=False, detail=said)
    if code == 404:
        raise errors.ProviderError("provider_job_lost", message, detail=said)
    if code == 455 or code >= 500:
        raise errors.ProviderError("provider_unavailable", message, detail=said)
    raise errors.ProviderError("provider_rejected", message, retryable=False, detail=said)


def finished(data: dict[str, Any]) -> remote.Pending | remote.Finished:
    """What a record-info `data` says of the task."""
    status = data.get("status")
    if status in PENDING:
        return remote.Pending(str(status))
    reason = redact.mask(str(data.get("errorMessage") or status))[:200]
    if status == "SENSITIVE_WORD_ERROR":
        raise errors.ProviderError(
            "content_refused", "the music API refused the lyrics", retryable=False, detail=reason
        )
    if status in FAILED:
        raise errors.ProviderError("provider_job_failed", f"the music API failed the song ({status})", detail=reason)
    if status != "SUCCESS":
        raise errors.ProviderError("provider_malformed", f"the music API's task is {str(status)[:40]!r}")
    try:
        tracks = data["response"]["sunoData"]
        track = next(t for t in tracks if t.get("audioUrl"))
        duration_s = float(track["duration"])
    except (KeyError, TypeError, ValueError, StopIteration, AttributeError):
        raise errors.ProviderError("provider_malformed", "the music API's finished task has no track") from None
    return remote.Finished(str(track["audioUrl"]), {"duration_s": duration_s, "track_id": str(track.get("id"))})


class SunoApi:
    """A `remote.RemoteApi` for the song stage."""

    def __init__(self, client: http.HttpProvider, model: str) -> None:
        self._client = client
        self._model = model

    def submit(self, job: repository.Job, callback_url: str | None, cancel: cancellation.Cancellation) -> str:
        done = events.LyricCompleted.model_validate(job.input)
        body = request_body(done, self._model, callback_url)
        # The API takes no idempotency key, nor tells tasks by a tag of ours (docs/providers.md): past the fence,
        # a request is a new task.
        answer = self._client.submit("api/v1/generate", cancel, json=body)
        task = data_of(answer).get("taskId")
        if not isinstance(task, str) or not task:
            raise errors.ProviderError("provider_malformed", "the music API gave no taskId")
        return task

    def poll(self, handle: str, cancel: cancellation.Cancellation) -> remote.Pending | remote.Finished:
        answer = self._client.json("GET", "api/v1/generate/record-info", cancel, params={"taskId": handle})
        return finished(data_of(answer))


def spread(lyrics: events.Lyrics, duration_s: float) -> tuple[events.TimedLine, ...]:
    """The lines evenly over the song, after a short intro and before a short outro."""
    lines = lyrics.lines()
    start, end = duration_s * 0.05, duration_s * 0.95
    step = (end - start) / max(len(lines), 1)
    return tuple(
        events.TimedLine(text=line, start_s=round(start + i * step, 3), end_s=round(start + (i + 1) * step, 3))
        for i, line in enumerate(lines)
    )
