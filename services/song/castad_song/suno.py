"""Songs from a Suno music API, as sunoapi.org publishes it (API v1, docs.sunoapi.org, read 2026-11).

Submit, then poll (castad_runtime.stage.remote):
- `POST /api/v1/generate` with the lyrics as `prompt`, the brief's genre as `style` (as written),
  the title and `callBackUrl`, which the API requires on every request: the gateway's link for the
  job when the gateway is reachable, else a URL under `.invalid` (RFC 6761: it never resolves), the
  poll deciding either way → `data.taskId`, the handle. Texts are cut to the model's limits;
- `GET /api/v1/generate/record-info?taskId=` → `data.status`: PENDING, TEXT_SUCCESS and
  FIRST_SUCCESS are still at work; SUCCESS brings `data.response.sunoData[]` with each track's
  `audioUrl` and `duration`; CALLBACK_EXCEPTION ("Error occurred during callback": the songs may
  be made) is a success once a track has its `audioUrl`, else still at work; SENSITIVE_WORD_ERROR
  is a refusal; CREATE_TASK_FAILED and GENERATE_AUDIO_FAILED a failure.

The API answers errors in the body's `code`, and its overview says it uses HTTP status codes too:
either is read the same way. 400/413 are a rejected request, 401 a bad key, 405/430 "too
frequent" (a rate limit), 429 credits that ran out (an operator must top them up: not retried),
455 maintenance (an outage of the provider's: handed back, not counted), 5xx trouble (retried).
The first track is kept; its lines are spread over its length (the API does not time them).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from castad_contracts import codes, events
from castad_runtime import redact
from castad_runtime.stage import cancellation, errors, http, remote, repository

PENDING = frozenset({"PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"})
FAILED = frozenset({"CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED"})
CALLBACK_EXCEPTION = "CALLBACK_EXCEPTION"
NO_CALLBACK = "https://no-callback.castad.invalid/polled"  # required by the API; nothing answers there
TAGS = {"verse": "[Verse]", "chorus": "[Chorus]", "bridge": "[Bridge]"}


@dataclasses.dataclass(frozen=True)
class Limits:
    """How many characters a model takes in custom mode (the generate reference, per model)."""

    prompt: int
    style: int
    title: int = 80


NEWER = Limits(prompt=5000, style=1000)
OLDER = Limits(prompt=3000, style=200)  # V3_5 and V4, and any model the reference does not name
LIMITS = {"V4_5": NEWER, "V4_5PLUS": NEWER, "V4_5ALL": NEWER, "V5": NEWER, "V3_5": OLDER, "V4": OLDER}


def limits(model: str) -> Limits:
    return LIMITS.get(model, OLDER)


def prompt(lyrics: events.Lyrics, max_chars: int = NEWER.prompt) -> str:
    """The lyrics as the API sings them: each section under its tag, as many whole lines as fit."""
    text = ""
    for section in lyrics.sections:
        head = ("\n\n" if text else "") + TAGS[section.kind]
        if len(text) + len(head) + 1 + len(section.lines[0] if section.lines else "") > max_chars:
            break
        text += head
        for line in section.lines:
            if len(text) + 1 + len(line) > max_chars:
                return text
            text += "\n" + line
    return text


def request_body(done: events.LyricCompleted, model: str, callback_url: str | None) -> dict[str, Any]:
    most = limits(model)
    return {
        "customMode": True,
        "instrumental": False,
        "model": model,
        "prompt": prompt(done.lyrics, most.prompt),
        "style": str(done.brief.genre)[: most.style],
        "title": done.lyrics.title[: most.title],
        "callBackUrl": callback_url or NO_CALLBACK,
    }


def code_error(
    code: int, said: str | None, *, retry_after_s: float | None = None, status: int | None = None
) -> errors.ProviderError:
    """The ProviderError an error code of the API stands for, whether in the body or as the HTTP status.

    What each then costs an attempt: castad_runtime.stage.failures.
    """
    message = f"the music API answered code {code}"  # what it said is the operators' (detail), not the tenant's
    if code in (405, 430):
        return errors.ProviderError(
            codes.ErrorCode.PROVIDER_RATE_LIMITED, message, retry_after_s=retry_after_s, status=status, detail=said
        )
    if code == 455:
        return errors.ProviderError(
            codes.ErrorCode.PROVIDER_MAINTENANCE, message, retry_after_s=retry_after_s, status=status, detail=said
        )
    if code == 401:
        return errors.ProviderError(codes.ErrorCode.PROVIDER_AUTH, message, retryable=False, status=status, detail=said)
    if code == 429:
        return errors.ProviderError(
            codes.ErrorCode.PROVIDER_CREDITS_EXHAUSTED, message, retryable=False, status=status, detail=said
        )
    if code == 404:
        return errors.ProviderError(codes.ErrorCode.PROVIDER_JOB_LOST, message, status=status, detail=said)
    if code >= 500 or code in http.RETRYABLE_STATUSES:
        return errors.ProviderError(
            codes.ErrorCode.PROVIDER_UNAVAILABLE, message, retry_after_s=retry_after_s, status=status, detail=said
        )
    return errors.ProviderError(codes.ErrorCode.PROVIDER_REJECTED, message, retryable=False, status=status, detail=said)


def classify(provider: str, status: int, headers: Mapping[str, str], body: bytes) -> errors.ProviderError:
    """Classify an error answer (an HTTP status of 400 or more).

    The API's own (a JSON body with a `code`) is read by that code, as in a 200 answer: HTTP 429 with code 429 is
    credits that ran out, not a rate limit. An answer without the API's body is from something in front of it (a
    proxy, a CDN) and means what HTTP says.
    """
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    code = data.get("code") if isinstance(data, dict) else None
    if not isinstance(code, int) or isinstance(code, bool) or code == 200:
        return http.classify(provider, status, headers, body)
    return code_error(code, http.reason(body) or None, retry_after_s=http.retry_after_s(headers), status=status)


def data_of(answer: Any) -> dict[str, Any]:
    """The `data` of an answer whose body `code` is 200; a ProviderError for any other code."""
    if not isinstance(answer, dict) or not isinstance(answer.get("code"), int):
        raise errors.ProviderError(codes.ErrorCode.PROVIDER_MALFORMED, "the music API's answer has no code")
    code = answer["code"]
    if code != 200:
        raise code_error(code, redact.mask(str(answer.get("msg") or ""))[:200] or None)
    data = answer.get("data")
    if not isinstance(data, dict):
        raise errors.ProviderError(codes.ErrorCode.PROVIDER_MALFORMED, "the music API's answer has no data")
    return data


def finished(data: dict[str, Any]) -> remote.Pending | remote.Finished:
    """What a record-info `data` says of the task."""
    status = data.get("status")
    if status in PENDING:
        return remote.Pending(str(status))
    reason = redact.mask(str(data.get("errorMessage") or status))[:200]
    if status == "SENSITIVE_WORD_ERROR":
        raise errors.ProviderError(
            codes.ErrorCode.CONTENT_REFUSED, "the music API refused the lyrics", retryable=False, detail=reason
        )
    if status in FAILED:
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_JOB_FAILED, f"the music API failed the song ({status})", detail=reason
        )
    if status == CALLBACK_EXCEPTION:  # its callback failed, not (necessarily) its songs: the poll decides
        return _track(data) or remote.Pending(CALLBACK_EXCEPTION)
    if status != "SUCCESS":
        raise errors.ProviderError(codes.ErrorCode.PROVIDER_MALFORMED, f"the music API's task is {str(status)[:40]!r}")
    track = _track(data)
    if track is None:
        raise errors.ProviderError(codes.ErrorCode.PROVIDER_MALFORMED, "the music API's finished task has no track")
    return track


def _track(data: dict[str, Any]) -> remote.Finished | None:
    """The first track that has its audio, if any."""
    try:
        tracks = data["response"]["sunoData"]
        track = next(t for t in tracks if t.get("audioUrl"))
        duration_s = float(track["duration"])
    except (KeyError, TypeError, ValueError, StopIteration, AttributeError):
        return None
    return remote.Finished(str(track["audioUrl"]), {"duration_s": duration_s, "track_id": str(track.get("id"))})


class SunoApi:
    """A `remote.RemoteApi` for the song stage."""

    def __init__(self, client: http.HttpProvider, model: str) -> None:
        self._client = client
        self._model = model

    def submit(
        self, job: repository.Job, callback_url: str | None, cancel: cancellation.Cancellation
    ) -> remote.Submitted:
        done = job.trigger(events.LyricCompleted)
        body = request_body(done, self._model, callback_url)
        # The API takes no idempotency key, nor tells tasks by a tag of ours (docs/providers.md): past the fence,
        # a request is a new task.
        answer = self._client.submit("api/v1/generate", cancel, json=body)
        task = data_of(answer).get("taskId")
        if not isinstance(task, str) or not task:
            raise errors.ProviderError(codes.ErrorCode.PROVIDER_MALFORMED, "the music API gave no taskId")
        return remote.Submitted(task)

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
