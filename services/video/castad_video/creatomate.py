"""Videos from Creatomate's render API, v2 (creatomate.com/docs/api, "the render object", read 2026-11).

Submit, then poll (castad_runtime.stage.remote):
- `POST /v2/renders` with a template of the user's and the pipeline's words and song as its
  modifications, `webhook_url` when the gateway is reachable, and the attempt's submission key (it
  starts with `castad-` and the pipeline id) as `metadata`
  → a render object whose `id` is the handle (API v1 answered a list of them: both are read);
- `GET /v2/renders/{id}` → `status`: planned, waiting, transcribing and rendering are still at
  work; succeeded brings `url` (and `width`, `height`); failed brings `error_message`; a render
  canceled at the provider (`cancelled`, or `canceled`: no page Castad read names it, the safer
  reading is that it may come) fails the stage for good, as an operator there meant it to stop.

The template's elements are filled by name (docs/providers.md):
`Title`, `Business`, `Region`, `Music.source` (the song's URL), and for each sung line n (from 1)
`Caption-n` with `Caption-n.time` and `Caption-n.duration` in seconds; `Caption-n` past the song's
last line (up to MAX_CAPTIONS) is blanked, so the template's own text never shows. With photos in
the brief, `Photo-n.source` for n from 1 to MAX_PHOTOS, the brief's photos in order and again from
the first when there are fewer, so no image element of the template shows its own picture (an
image element's source is set by a modification as the audio's is: creatomate.com/docs, "API
automation"): each a URL the render API fetches, which `photo_urls` gives (a presigned URL of
the bucket or a signed link of the gateway for an upload; a photo named by an https URL, that
URL). A brief without photos sends no `Photo-n`: the template's pictures show. A modification
that matches no element of the template renders the template's placeholder instead, so before it
pays for a render the adapter reads the template's own elements (`GET /v1/templates/{id}`, its
RenderScript `source`, compositions' elements included; read again every `TEMPLATE_RECHECK_S`, so an
edited template is seen) and fails the stage for good (`template_mismatch`), nothing submitted, when
one the video needs is not there (any but a blanked caption or a photo past `Photo-1`): the template
must be fixed. The render answer's `warnings` and `errors` are logged and kept on the attempt
(`attempts.notes`); any `errors`, or a warning naming an element the video needs, fails the stage for
good too. A template with fewer image elements than photos shows the first ones (the API warns of the
others, logged and kept).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from castad_contracts import brief, codes, events
from castad_runtime import health, redact
from castad_runtime.stage import cancellation, errors, http, remote, repository

log = logging.getLogger(__name__)

PENDING = frozenset({"planned", "waiting", "transcribing", "rendering"})
CANCELED = frozenset({"cancelled", "canceled"})
MAX_CAPTIONS = 60
MAX_PHOTOS = brief.MAX_PHOTOS
QUOTED = re.compile(r"""['"`]([^'"`]{1,100})['"`]""")
TEMPLATE_RECHECK_S = 300.0  # how long the template's elements, once read, are taken as they were
ALWAYS_NEEDED = frozenset({"Title", "Business", "Region", "Music", "Caption-1"})  # what every video fills


def modifications(done: events.SongCompleted, song_url: str, photo_urls: Sequence[str] = ()) -> dict[str, Any]:
    """The template's elements by name and what each shows (the module's docstring says which)."""
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
    for n in range(len(done.timed_lines) + 1, MAX_CAPTIONS + 1):  # the template's own text must not show
        values[f"Caption-{n}"] = ""
    if photo_urls:  # every image element shows one of the brief's photos, none the template's own
        for n in range(1, MAX_PHOTOS + 1):
            values[f"Photo-{n}.source"] = photo_urls[(n - 1) % len(photo_urls)]
    return values


def needed(done: events.SongCompleted) -> frozenset[str]:
    """The template's elements the video cannot do without: all it is sent but the blanked captions."""
    lines = min(len(done.timed_lines), MAX_CAPTIONS)
    photo = {"Photo-1"} if done.brief.photos else set()  # without one, the brief's photos would not show at all
    return frozenset({"Title", "Business", "Region", "Music"} | {f"Caption-{n}" for n in range(1, lines + 1)} | photo)


def notes(render: dict[str, Any]) -> list[str]:
    """The render's `errors` and `warnings` as text (strings, or objects with a message)."""
    said: list[str] = []
    for field in ("errors", "warnings"):
        items = render.get(field)
        for item in items if isinstance(items, list) else []:
            text = item.get("message") or item.get("text") or item if isinstance(item, dict) else item
            said.append(redact.mask(str(text))[:300])
    return said


def element_names(source: Any) -> frozenset[str]:
    """Every element's name in a template's RenderScript source, the elements of its compositions included."""
    names: set[str] = set()
    pending = [source]
    while pending:
        item = pending.pop()
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("name"), str):
            names.add(item["name"])
        children = item.get("elements")
        pending.extend(children if isinstance(children, list) else [])
    return frozenset(names)


def check_template(elements: frozenset[str], done: events.SongCompleted) -> None:
    """Fail for good, before anything is paid for, if the template lacks an element the video needs."""
    missing = sorted(needed(done) - elements)
    if missing:
        raise errors.ProviderError(
            codes.ErrorCode.TEMPLATE_MISMATCH,
            f"the video template has no element {', '.join(missing[:5])} (named in docs/providers.md)",
            retryable=False,
            detail=f"the template's elements: {', '.join(sorted(elements))}"[:1000],
        )


def check_notes(render: dict[str, Any], done: events.SongCompleted) -> tuple[str, ...]:
    """Log what the API said of the render's modifications and give it back for the attempt.

    Fail if it found errors, or names an element the video needs.
    """
    said = notes(render)
    if not said:
        return ()
    log.warning("the render API's notes on render %s: %s", render.get("id"), " | ".join(said))
    if isinstance(render.get("errors"), list) and render["errors"]:
        raise errors.ProviderError(
            codes.ErrorCode.TEMPLATE_MISMATCH,
            "the render API found errors in what the stage sent the template",
            retryable=False,
            detail="; ".join(said)[:1000],
        )
    must = needed(done)
    missing = sorted({name.split(".")[0] for text in said for name in QUOTED.findall(text)} & must)
    if missing:
        raise errors.ProviderError(
            codes.ErrorCode.TEMPLATE_MISMATCH,
            f"the video template has no element {', '.join(missing[:5])} (named in docs/providers.md)",
            retryable=False,
            detail="; ".join(said)[:1000],
        )
    return tuple(said)


def render_of(answer: Any) -> dict[str, Any]:
    render = answer[0] if isinstance(answer, list) and answer else answer
    if not isinstance(render, dict) or not isinstance(render.get("id"), str) or not render["id"]:
        raise errors.ProviderError(codes.ErrorCode.PROVIDER_MALFORMED, "the render API's answer has no render id")
    return render


def finished(render: dict[str, Any]) -> remote.Pending | remote.Finished:
    status = render.get("status")
    if status in PENDING:
        return remote.Pending(str(status))
    if status in CANCELED:
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_JOB_CANCELED, "the render was canceled at the render API", retryable=False
        )
    if status == "failed":
        reason = redact.mask(str(render.get("error_message") or "no reason given"))[:200]
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_JOB_FAILED, "the render API failed the video", detail=reason
        )
    url = render.get("url")
    if status != "succeeded" or not isinstance(url, str):
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_MALFORMED, f"the render is {str(status)[:40]!r} without a URL"
        )
    details: dict[str, Any] = {
        k: render[k] for k in ("width", "height", "duration") if isinstance(render.get(k), int | float)
    }
    if isinstance(render.get("snapshot_url"), str):  # the template sets snapshot_time: the video's poster
        details["snapshot_url"] = render["snapshot_url"]
    return remote.Finished(url, details)


class CreatomateApi:
    """A `remote.RemoteApi` for the video stage.

    `song_url` and `photo_urls` say where the render API fetches the song and the brief's photos (in the brief's
    order; `photo_urls` is also given when the stage began the job, for the photos' seals).
    """

    def __init__(
        self,
        client: http.HttpProvider,
        template_id: str,
        song_url: Callable[[events.SongCompleted], str],
        photo_urls: Callable[[events.SongCompleted, dt.datetime | None], Sequence[str]],
    ) -> None:
        self._client = client
        self._template_id = template_id
        self._song_url = song_url
        self._photo_urls = photo_urls
        self._elements: tuple[float, frozenset[str] | None] | None = None  # when read, and what (None: no source)
        self._lock = threading.Lock()

    def template_elements(self, cancel: cancellation.Cancellation, fresh: bool = False) -> frozenset[str] | None:
        """The names of the template's elements; None if it shows none (then nothing is checked).

        Read at most every TEMPLATE_RECHECK_S (`fresh`: read now). A template the API does not have fails for
        good; one that cannot be read on the way is taken as last read, or, never read yet, raises the call's
        ProviderError (retryable: a free read must not cost a render that may be fine)."""
        with self._lock:
            last = self._elements
        if not fresh and last is not None and time.monotonic() - last[0] < TEMPLATE_RECHECK_S:
            return last[1]
        path = f"v1/templates/{urllib.parse.quote(self._template_id, safe='')}"
        try:
            template = self._client.json("GET", path, cancel)
        except errors.ProviderError as error:
            if error.status == 404:
                raise errors.ProviderError(
                    codes.ErrorCode.TEMPLATE_MISMATCH,
                    f"the render API has no template {self._template_id}",
                    retryable=False,
                ) from None
            if last is None:
                raise
            log.warning("template %s could not be read (%s): taken as last read", self._template_id, error.code)
            return last[1]
        source = template.get("source") if isinstance(template, dict) else None
        elements = element_names(source) if isinstance(source, dict) else None
        if elements is None and (last is None or last[1] is not None):  # said once, until it shows elements again
            log.warning("the render API shows no elements of template %s: rendering unchecked", self._template_id)
        with self._lock:
            self._elements = (time.monotonic(), elements)
        return elements

    def template_fits(self) -> str:
        """Readiness: "ok" unless the template lacks an element every video needs (its title, names, song, a caption).

        A template that cannot be read now is not this replica's trouble: "ok", and the renders find out."""
        try:
            elements = self.template_elements(cancellation.Cancellation())
        except errors.ProviderError as error:
            return f"template {self._template_id}: {error.message}" if not error.retryable else health.OK
        missing = sorted(ALWAYS_NEEDED - elements) if elements is not None else []
        return f"template {self._template_id} has no element {', '.join(missing)}" if missing else health.OK

    def submit(
        self, job: repository.Job, callback_url: str | None, cancel: cancellation.Cancellation
    ) -> remote.Submitted:
        done = job.trigger(events.SongCompleted)
        if done.brief.formats:  # the template has one size of its own: nothing is paid for a part of what is asked
            raise errors.ProviderError(
                codes.ErrorCode.FORMAT_UNSUPPORTED,
                f"the render API's template makes one format; the brief asks for {', '.join(done.brief.formats)}"
                " (render them locally: CASTAD_VIDEO_PROVIDER=local)",
                retryable=False,
            )
        elements = self.template_elements(cancel)
        if elements is not None and needed(done) - elements:  # read again before failing: it may have been fixed
            elements = self.template_elements(cancel, fresh=True)
        if elements is not None:
            check_template(elements, done)
        body: dict[str, Any] = {
            "template_id": self._template_id,
            "modifications": modifications(done, self._song_url(done), self._photo_urls(done, job.created_at)),
            # The API takes no idempotency key; the attempt's key tags the render (it comes back in the render
            # object and the webhook), so that renders one attempt made twice can be told (docs/providers.md).
            "metadata": job.submission_key,
        }
        if callback_url:
            body["webhook_url"] = callback_url
        render = render_of(self._client.submit("v2/renders", cancel, json=body))
        return remote.Submitted(str(render["id"]), check_notes(render, done))

    def poll(self, handle: str, cancel: cancellation.Cancellation) -> remote.Pending | remote.Finished:
        try:
            answer = self._client.json("GET", f"v2/renders/{urllib.parse.quote(handle, safe='')}", cancel)
        except errors.ProviderError as error:
            if error.status == 404:  # the render is gone: a new attempt renders anew
                raise errors.ProviderError(
                    codes.ErrorCode.PROVIDER_JOB_LOST, f"the render API no longer knows {handle}"
                ) from None
            raise
        return finished(render_of(answer))
