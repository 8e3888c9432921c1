"""Videos from Creatomate's render API, v2 (creatomate.com/docs/api, "the render object", read 2026-11).

Submit, then poll (castad_runtime.stage.remote); what each error costs an attempt: castad_runtime.stage.failures.
- `POST /v2/renders` with a template of the user's and the pipeline's words and song as its
  modifications, `webhook_url` when the gateway is reachable, and the attempt's submission key (it
  starts with `castad-` and the pipeline id) as `metadata`
  → a render object whose `id` is the handle (API v1 answered a list of them: both are read);
- `GET /v2/renders/{id}` → `status`: planned, waiting, transcribing and rendering are still at
  work; succeeded brings `url` (and `width`, `height`); failed brings `error_message`; a render
  canceled at the provider (`cancelled`, or `canceled`: no page Castad read names it, the safer
  reading is that it may come) fails the stage for good, as an operator there meant it to stop.

The template's elements are filled by name (castad_video.creatomate_template says which; docs/providers.md). A
modification that matches no element of the template renders the template's placeholder instead, so before it
pays for a render the adapter reads the template's own elements (`GET /v1/templates/{id}`, its
RenderScript `source`, compositions' elements included; read again every `TEMPLATE_RECHECK_S`, so an
edited template is seen) and fails the stage for good (`template_mismatch`), nothing submitted, when
one the video needs is not there (any but a blanked caption or a photo past `Photo-1`): the template
must be fixed. The render answer's `warnings` and `errors` are logged and kept on the attempt
(`attempts.notes`); any `errors`, or a warning naming an element the video needs, fails the stage for
good too. A template with fewer image elements than photos shows the first ones (the API warns of the
others, logged and kept).

A brief naming formats is a render per format, each of a template of that format's frame size
(`CreatomateApi`; docs/providers.md, "Formats").
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from castad_contracts import brief, codes, events
from castad_runtime import health, redact
from castad_runtime.stage import cancellation, errors, http, remote, repository

from castad_video import creatomate_template

log = logging.getLogger(__name__)

PENDING = frozenset({"planned", "waiting", "transcribing", "rendering"})
CANCELED = frozenset({"cancelled", "canceled"})
TEMPLATE_RECHECK_S = 300.0  # how long the template's elements, once read, are taken as they were


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


FORMAT_PART = re.compile("(" + "|".join(re.escape(shape.value) for shape in brief.Format) + ")=([^;=]+)")
UNSENT = "unsent"  # in a handle, a format whose render was not asked for: its request failed after others were


def format_handle(renders: Sequence[tuple[brief.Format, str]]) -> str:
    """The handle of a brief's renders, one per format: `1:1=<render id>;16:9=<render id>`."""
    return ";".join(f"{shape}={render_id}" for shape, render_id in renders)


def format_renders(handle: str) -> list[tuple[brief.Format, str]] | None:
    """The renders of a handle `format_handle` made; None for the handle of one render (a brief without formats)."""
    if "=" not in handle:
        return None
    parts = handle.split(";")
    found = [FORMAT_PART.fullmatch(part) for part in parts]
    if not all(found):
        raise errors.ProviderError(codes.ErrorCode.PROVIDER_MALFORMED, f"not a handle of renders: {handle[:100]}")
    return [(brief.Format(match.group(1)), match.group(2)) for match in found if match]


class CreatomateApi:
    """A `remote.RemoteApi` for the video stage.

    `song_url` and `photo_urls` say where the render API fetches the song and the brief's photos (in the brief's
    order; `photo_urls` is also given when the stage began the job, for the photos' seals). A brief without formats
    is one render of the template `format_templates` names for its format, else of `template_id`, whatever its
    size (its handle the render's id). A brief naming formats is a render per format, each of the template
    `format_templates` names for it, or of `template_id` if that one has the format's shape; each template's size
    must have its format's shape. Its handle names every render (`format_handle`); it is done once every render is,
    failed once one failed, and an attempt after it renders again only the formats whose render failed, is gone, or
    is still at work past `give_up_s` since it was asked for. Every render already asked for is in the handle, even
    when a request for another then failed: none is paid for twice.
    """

    def __init__(
        self,
        client: http.HttpProvider,
        template_id: str,
        song_url: Callable[[events.SongCompleted], str],
        photo_urls: Callable[[events.SongCompleted, dt.datetime | None], Sequence[str]],
        format_templates: Mapping[brief.Format, str] | None = None,
        give_up_s: float | None = None,
        logo_url: Callable[[events.SongCompleted, dt.datetime | None], str | None] | None = None,
    ) -> None:
        self._client = client
        self._logo_url = logo_url
        self._give_up_s = give_up_s
        self._template_id = template_id
        self._format_templates = dict(format_templates or {})
        self._song_url = song_url
        self._photo_urls = photo_urls
        self._templates: dict[
            str, tuple[float, creatomate_template.Template]
        ] = {}  # when each was read, and what it says
        self._lock = threading.Lock()

    def template(
        self, cancel: cancellation.Cancellation, fresh: bool = False, template_id: str | None = None
    ) -> creatomate_template.Template:
        """What a template (the stage's own by default) says of itself.

        Read at most every TEMPLATE_RECHECK_S (`fresh`: read now). A template the API does not have fails for
        good; one that cannot be read on the way is taken as last read, or, never read yet, raises the call's
        ProviderError (retryable: a free read must not cost a render that may be fine)."""
        template_id = template_id or self._template_id
        with self._lock:
            last = self._templates.get(template_id)
        if not fresh and last is not None and time.monotonic() - last[0] < TEMPLATE_RECHECK_S:
            return last[1]
        path = f"v1/templates/{urllib.parse.quote(template_id, safe='')}"
        try:
            answer = self._client.json("GET", path, cancel)
        except errors.ProviderError as error:
            if error.status == 404:
                raise errors.ProviderError(
                    codes.ErrorCode.TEMPLATE_MISMATCH, f"the render API has no template {template_id}", retryable=False
                ) from None
            if last is None:
                raise
            log.warning("template %s could not be read (%s): taken as last read", template_id, error.code)
            return last[1]
        source = answer.get("source") if isinstance(answer, dict) else None
        read = creatomate_template.described(source)
        if read.elements is None and (last is None or last[1].elements is not None):  # said once, until it shows some
            log.warning("the render API shows no elements of template %s: rendering unchecked", template_id)
        with self._lock:
            self._templates[template_id] = (time.monotonic(), read)
        return read

    def template_elements(
        self, cancel: cancellation.Cancellation, fresh: bool = False, template_id: str | None = None
    ) -> frozenset[str] | None:
        """The names of a template's elements; None if it shows none (then nothing is checked)."""
        return self.template(cancel, fresh, template_id).elements

    def template_fits(self) -> str:
        """Readiness: "ok" unless the template lacks an element every video needs (its title, names, song, a caption).

        A template that cannot be read now is not this replica's trouble: "ok", and the renders find out."""
        said = []
        for template_id in dict.fromkeys((self._template_id, *self._format_templates.values())):
            try:
                elements = self.template_elements(cancellation.Cancellation(), template_id=template_id)
            except errors.ProviderError as error:
                said += [f"template {template_id}: {error.message}"] if not error.retryable else []
                continue
            missing = sorted(creatomate_template.ALWAYS_NEEDED - elements) if elements is not None else []
            said += [f"template {template_id} has no element {', '.join(missing)}"] if missing else []
        return "; ".join(said) or health.OK

    def submit(
        self, job: repository.Job, callback_url: str | None, cancel: cancellation.Cancellation
    ) -> remote.Submitted:
        done = job.trigger(events.SongCompleted)
        if not done.brief.formats:  # one render, as before there were formats
            template_id = self._format_templates.get(done.brief.frames[0], self._template_id)
            render = self._render(job, done, template_id, callback_url, cancel)
            return remote.Submitted(str(render["id"]), creatomate_template.check_notes(render, done))
        templates = {shape: self._template_for(shape, done, cancel) for shape in done.brief.frames}  # all, or none paid
        kept = self._kept(job, cancel)  # every look-up made before anything is paid for
        values = self._values(job, done)  # every format's
        renders: list[tuple[brief.Format, str]] = []
        notes: list[str] = []
        asked = False  # whether this submit paid for a render
        for shape, template_id in templates.items():
            if shape in kept:
                log.info(
                    "pipeline %s: the %s render %s an earlier attempt asked for is kept",
                    job.pipeline_id,
                    shape,
                    kept[shape],
                )
                renders.append((shape, kept[shape]))
                continue
            try:
                render = self._render(job, done, template_id, callback_url, cancel, values)
            except errors.ProviderError as error:
                if not asked:
                    raise  # nothing asked for yet: the earlier attempt's handle still names what was kept
                log.warning(
                    "pipeline %s: the %s render was not asked for (%s): the next attempt asks for it",
                    job.pipeline_id,
                    shape,
                    error.code,
                )
                missing = [(left, UNSENT) for left in list(templates)[len(renders) :]]
                return remote.Submitted(format_handle([*renders, *missing]), tuple(notes))
            asked = True
            notes += creatomate_template.check_notes(render, done)
            renders.append((shape, str(render["id"])))
        return remote.Submitted(format_handle(renders), tuple(notes))

    def _kept(self, job: repository.Job, cancel: cancellation.Cancellation) -> dict[brief.Format, str]:
        """The renders an earlier attempt asked for that are done, or still at work within the give-up time."""
        earlier = format_renders(job.previous_handle) if job.previous_handle else None
        within = self._give_up_s is None or job.previous_waited_s is None or job.previous_waited_s < self._give_up_s
        kept = {}
        for shape, render_id in earlier or []:
            if render_id == UNSENT:
                continue
            try:
                state = finished(render_of(self._get(render_id, cancel)))
            except errors.ProviderError as error:
                if error.code in remote.GONE:
                    continue
                raise
            if isinstance(state, remote.Finished) or within:
                kept[shape] = render_id
        return kept

    def _template_for(self, shape: brief.Format, done: events.SongCompleted, cancel: cancellation.Cancellation) -> str:
        """The template of a format, checked: it has the format's shape and every element the video needs."""
        template_id = self._format_templates.get(shape, self._template_id)
        read = self.template(cancel, template_id=template_id)
        if read.size is None or creatomate_template.shape_of(read.size) != shape:
            read = self.template(cancel, fresh=True, template_id=template_id)  # it may have been edited since
        if read.size is None or creatomate_template.shape_of(read.size) != shape:
            if shape not in self._format_templates:
                raise errors.ProviderError(
                    codes.ErrorCode.FORMAT_UNSUPPORTED,
                    f"no template of the render API makes {shape} videos (CASTAD_VIDEO_CREATOMATE_FORMAT_TEMPLATES)",
                    retryable=False,
                )
            size = "no size" if read.size is None else f"a {read.size[0]}x{read.size[1]} frame"
            raise errors.ProviderError(
                codes.ErrorCode.TEMPLATE_MISMATCH, f"the {shape} template {template_id} has {size}", retryable=False
            )
        if read.elements is not None:
            creatomate_template.check_template(read.elements, done)
        return template_id

    def _render(
        self,
        job: repository.Job,
        done: events.SongCompleted,
        template_id: str,
        callback_url: str | None,
        cancel: cancellation.Cancellation,
        values: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The render object of a render asked for: the template filled with the pipeline's `values` (or made now)."""
        elements = self.template_elements(cancel, template_id=template_id)  # as read before it is paid for
        if not done.brief.formats:  # (each format's template is checked before any is asked for: _template_for)
            if (
                elements is not None and creatomate_template.needed(done) - elements
            ):  # read again before failing: it may have been fixed
                elements = self.template_elements(cancel, fresh=True, template_id=template_id)
            if elements is not None:
                creatomate_template.check_template(elements, done)
        values = values or self._values(job, done)
        if "Logo.source" in values and elements is not None and "Logo" not in elements:
            log.warning("template %s has no Logo element: the brand's logo is not in its video", template_id)
            values = {name: value for name, value in values.items() if name != "Logo.source"}
        body: dict[str, Any] = {
            "template_id": template_id,
            "modifications": values,
            # The API takes no idempotency key; the attempt's key tags the render (it comes back in the render
            # object and the webhook), so that renders one attempt made twice can be told (docs/providers.md).
            "metadata": job.submission_key,
        }
        if callback_url:
            body["webhook_url"] = callback_url
        return render_of(self._client.submit("v2/renders", cancel, json=body))

    def _values(self, job: repository.Job, done: events.SongCompleted) -> dict[str, Any]:
        """The modifications of the job's renders: where the song, photos and logo are, and the brief's words."""
        begun = job.created_at
        logo = self._logo_url(done, begun) if self._logo_url is not None else None
        return creatomate_template.modifications(done, self._song_url(done), self._photo_urls(done, begun), logo)

    def poll(self, handle: str, cancel: cancellation.Cancellation) -> remote.Pending | remote.Finished:
        renders = format_renders(handle)
        if renders is None:
            return finished(render_of(self._get(handle, cancel)))
        states = []
        for shape, render_id in renders:
            if render_id == UNSENT:  # failed at once (a lost render would be waited on a while as not listed yet)
                raise errors.ProviderError(
                    codes.ErrorCode.PROVIDER_JOB_FAILED, f"the {shape} render was not asked for: its request failed"
                )
            try:
                states.append((shape, finished(render_of(self._get(render_id, cancel)))))
            except errors.ProviderError as error:  # said of the format whose render it is
                raise errors.ProviderError(
                    error.code,
                    f"{error.message} ({shape})",
                    retryable=error.retryable,
                    retry_after_s=error.retry_after_s,
                    status=error.status,
                    detail=error.detail,
                ) from None
        pending = next((state for _, state in states if isinstance(state, remote.Pending)), None)
        if pending is not None:
            return pending
        done = [(shape, state) for shape, state in states if isinstance(state, remote.Finished)]
        every = [{"format": shape.value, "url": state.url, **state.details} for shape, state in done]
        return remote.Finished(done[0][1].url, {**done[0][1].details, "renders": every})

    def _get(self, render_id: str, cancel: cancellation.Cancellation) -> Any:
        try:
            return self._client.json("GET", f"v2/renders/{urllib.parse.quote(render_id, safe='')}", cancel)
        except errors.ProviderError as error:
            if error.status == 404:  # the render is gone: a new attempt renders anew
                raise errors.ProviderError(
                    codes.ErrorCode.PROVIDER_JOB_LOST, f"the render API no longer knows {render_id}"
                ) from None
            raise
