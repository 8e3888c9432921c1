"""Videos from Creatomate's render API, v2 (creatomate.com/docs/api, "the render object", read 2026-11).

Submit, then poll (castad_runtime.stage.remote):
- `POST /v2/renders` with a template of the user's and the pipeline's words and song as its
  modifications, `webhook_url` when the gateway is reachable, and the attempt's submission key (it
  starts with `castad-` and the pipeline id) as `metadata`
  → a render object whose `id` is the handle (API v1 answered a list of them: both are read);
- `GET /v2/renders/{id}` → `status`: planned, waiting, transcribing and rendering are still at
  work; succeeded brings `url` (and `width`, `height`); failed brings `error_message`.

The template's elements are filled by name (docs/providers.md):
`Title`, `Business`, `Region`, `Music.source` (the song's URL), and for each sung line n (from 1)
`Caption-n` with `Caption-n.time` and `Caption-n.duration` in seconds.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import Any

from castad_contracts import events
from castad_runtime import redact
from castad_runtime.stage import cancellation, errors, http, remote, repository

PENDING = frozenset({"planned", "waiting", "transcribing", "rendering"})
MAX_CAPTIONS = 60


def modifications(done: events.SongCompleted, song_url: str) -> dict[str, Any]:
    values: dict[str, Any] = {
        "Title": done.lyrics.title,
        "Business": done.brief.customer_name,
        "Region": done.brief.region,
        "Music.source": song_url,
    }
    for n, line in enumerate(done.timed_lines[:MAX_CAPTIONS], start=1):
        values[f"Caption-{n}"] = line.text
        values[f"Caption-{n}.time"] = round(line.start_s, 3)
        values[f"Caption-{n}.duration"] = round(max(line.end_s - line.start_s, 0.1), 3)
    return values


def render_of(answer: Any) -> dict[str, Any]:
    render = answer[0] if isinstance(answer, list) and answer else answer
    if not isinstance(render, dict) or not isinstance(render.get("id"), str) or not render["id"]:
        raise errors.ProviderError("provider_malformed", "the render API's answer has no render id")
    return render


def finished(render: dict[str, Any]) -> remote.Pending | remote.Finished:
    status = render.get("status")
    if status in PENDING:
        return remote.Pending(str(status))
    if status == "failed":
        reason = redact.mask(str(render.get("error_message") or "no reason given"))[:200]
        raise errors.ProviderError("provider_job_failed", "the render API failed the video", detail=reason)
    url = render.get("url")
    if status != "succeeded" or not isinstance(url, str):
        raise errors.ProviderError("provider_malformed", f"the render is {str(status)[:40]!r} without a URL")
    details = {k: render[k] for k in ("width", "height", "duration") if isinstance(render.get(k), int | float)}
    return remote.Finished(url, details)


class CreatomateApi:
    """A `remote.RemoteApi` for the video stage; `song_url` says where the render API fetches the song."""

    def __init__(
        self, client: http.HttpProvider, template_id: str, song_url: Callable[[events.SongCompleted], str]
    ) -> None:
        self._client = client
        self._template_id = template_id
        self._song_url = song_url

    def submit(self, job: repository.Job, callback_url: str | None, cancel: cancellation.Cancellation) -> str:
        done = events.SongCompleted.model_validate(job.input)
        body: dict[str, Any] = {
            "template_id": self._template_id,
            "modifications": modifications(done, self._song_url(done)),
            # The API takes no idempotency key; the attempt's key tags the render (it comes back in the render
            # object and the webhook), so that renders one attempt made twice can be told (docs/providers.md).
            "metadata": job.submission_key,
        }
        if callback_url:
            body["webhook_url"] = callback_url
        return str(render_of(self._client.submit("v2/renders", cancel, json=body))["id"])

    def poll(self, handle: str, cancel: cancellation.Cancellation) -> remote.Pending | remote.Finished:
        try:
            answer = self._client.json("GET", f"v2/renders/{urllib.parse.quote(handle, safe='')}", cancel)
        except errors.ProviderError as error:
            if error.status == 404:  # the render is gone: a new attempt renders anew
                raise errors.ProviderError("provider_job_lost", f"the render API no longer knows {handle}") from None
            raise
        return finished(render_of(answer))
