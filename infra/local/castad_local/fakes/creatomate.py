"""A local server that behaves like Creatomate's REST API (v2), for tests and offline runs.

`POST /v2/renders` checks a bearer key and the body as the API does (a `template_id`, flat
`modifications`, an optional `webhook_url` and `metadata`) and answers 202 with one render
object, whose `warnings` name each modification that matches no element of the template (the
template's elements: `elements`; such a render still renders, with the template's own content
there); `GET /v2/renders/<id>` reports it. `GET /v1/templates/<id>` gives the template with its
RenderScript `source`, whose `elements` (and a composition's) are named, and its frame size (`sizes`, by template
id; 360x640 for any other), which a render of it has too. A render moves by the
time since it was submitted (`render_s`): planned, waiting, rendering, then succeeded, its `url` a 2 s 360x640 MP4 under
`/_fake/renders/`. When it succeeds or fails the render is posted to its `webhook_url` from one
background thread. A render may also end `cancelled` (canceled at the provider, no file). Errors
are the API's: a 4xx with `{"hint": ...}`. Like the API, it takes no
idempotency key and lists no renders: every render request is a new render, its `metadata` given back.

Tests script it: `POST /_fake/script` queues replies for the next API requests (see
`server.Reply`: an HTTP status with or without Retry-After, a hang, a malformed or oversized
body); `POST /_fake/renders-plan` plans the next renders (see `Plan`: failing, never finishing,
an output of the wrong type or size). `GET /_fake/requests` and `GET /_fake/callbacks` list what
it received and posted. Run it with `python -m castad_local.fakes creatomate --port 8092`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from castad_local.fakes import media, server

DEFAULT_KEY = "creatomate-castad-local"
TEMPLATE_NAME = "castad"
WIDTH, HEIGHT, FRAME_RATE, DURATION_S = 360, 640, 30, 2.0
FAILURE = "The render failed: the template could not be rendered with these modifications."

RENDER_PATH = re.compile(r"/v2/renders/([0-9a-f-]{36})")
TEMPLATE_PATH = re.compile(r"/v1/templates/([^/]+)")
OUTPUT_PATH = re.compile(r"/_fake/renders/([0-9a-f-]{36})\.(mp4|jpg)")
SNAPSHOT_TIME = 1.0  # the template's snapshot_time: each render has a snapshot (a JPEG of that moment) besides
SCALARS = (str, int, float, bool, type(None))
# The elements of the template Castad's docs describe (docs/providers.md): what modifications may name.
ELEMENTS = frozenset(
    {"Title", "Business", "Region", "Music", "Logo"}
    | {f"Caption-{n}" for n in range(1, 61)}
    | {f"Photo-{n}" for n in range(1, 21)}
)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one render goes. `outcome`: ok, fail, never (planned for ever), cancelled (canceled at
    the provider); `output`: ok, wrong_type (an HTML page), oversized (`size` bytes), octet_stream
    (the MP4 as `application/octet-stream`, as a CDN may serve it); `snapshot`: ok (a JPEG), none (no
    `snapshot_url`, as for a template without `snapshot_time`), gone (its URL answers 404); `seconds`: how long
    it takes (the fake's `render_s` when None)."""

    outcome: str = "ok"
    output: str = "ok"
    seconds: float | None = None
    size: int = 0
    snapshot: str = "ok"

    def __post_init__(self) -> None:
        if self.outcome not in {"ok", "fail", "never", "cancelled"}:
            raise ValueError(f"unknown outcome {self.outcome!r}")
        if self.output not in {"ok", "wrong_type", "oversized", "octet_stream"}:
            raise ValueError(f"unknown output {self.output!r}")
        if self.snapshot not in {"ok", "none", "gone"}:
            raise ValueError(f"unknown snapshot {self.snapshot!r}")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class Render:
    """A submitted render; its status is read off the time since `submitted`."""

    id: str
    body: dict[str, Any]
    plan: Plan
    seconds: float
    submitted: float  # time.monotonic()

    def steps(self) -> list[tuple[float, str]]:
        """(seconds after submitting, status) of every status it goes through."""
        if self.plan.outcome == "never":
            return [(0.0, "planned")]
        if self.plan.outcome == "cancelled":
            return [(0.0, "planned"), (0.3 * self.seconds, "cancelled")]
        end = "succeeded" if self.plan.outcome == "ok" else "failed"
        return [
            (0.0, "planned"),
            (0.1 * self.seconds, "waiting"),
            (0.3 * self.seconds, "rendering"),
            (self.seconds, end),
        ]

    def status(self) -> str:
        elapsed = time.monotonic() - self.submitted
        return [status for after, status in self.steps() if after <= elapsed][-1]


def hint(status: int, text: str) -> server.Response:
    return server.Response.of_json(status, {"hint": text})


def invalid(body: Any, templates: frozenset[str] | None) -> str | None:
    """What is wrong with a render body, None when nothing is."""
    if not isinstance(body, dict):
        return "The request body must be a JSON object."
    template = body.get("template_id")
    if not isinstance(template, str) or not template:
        return "The parameter 'template_id' is required."
    if templates is not None and template not in templates:
        return f"Template '{template}' was not found."
    modifications = body.get("modifications", {})
    if not isinstance(modifications, dict) or not all(
        isinstance(k, str) and isinstance(v, SCALARS) for k, v in modifications.items()
    ):
        return "The parameter 'modifications' must be an object of names to text, numbers, booleans or null."
    for name in ("webhook_url", "metadata"):
        if not isinstance(body.get(name), str | None):
            return f"The parameter '{name}' must be a string."
    if body.get("output_format", "mp4") != "mp4":
        return "The fake renders only 'mp4'."
    return None


class FakeCreatomate(server.FakeServer):
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str = DEFAULT_KEY,
        render_s: float = 5.0,
        templates: set[str] | frozenset[str] | None = None,
        elements: set[str] | frozenset[str] = ELEMENTS,
        sizes: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.api_key = api_key
        self.sizes = dict(sizes or {})
        self.elements = frozenset(elements)
        self.updated_at = "2026-11-01T00:00:00.000Z"  # the template's version, as the API dates it
        self.template_reads = 0
        self.template_outages = 0  # how many template reads from now answer 503
        self.render_s = render_s
        self.templates = None if templates is None else frozenset(templates)
        self._script = server.Script(server.Reply)
        self._plans: collections.deque[Plan] = collections.deque()
        self._renders: dict[str, Render] = {}
        self._lock = threading.Lock()
        self._callbacks = server.Callbacks()
        super().__init__(host, port)

    @property
    def received(self) -> list[dict[str, Any]]:
        """The API requests received (method, path, query, body), the last 10,000."""
        return self._script.received()

    @property
    def callbacks(self) -> list[dict[str, Any]]:
        """The webhooks posted: url, id, callbackType (succeeded or failed), and the answer's status or the error."""
        return self._callbacks.sent()

    def script(self, *replies: server.Reply) -> None:
        self._script.add(*replies)

    def plan(self, *plans: Plan) -> None:
        with self._lock:
            self._plans.extend(plans)

    def stop(self) -> None:
        super().stop()
        self._callbacks.close()

    def handle(self, request: server.Request) -> server.Response:
        if request.path.startswith("/_fake/"):
            return self._fake(request)
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return hint(401, "Invalid API key.")
        if (request.method, request.path) == ("POST", "/v2/renders"):
            return self._scripted(request, lambda: self._submit(request))
        if request.method == "GET" and (match := RENDER_PATH.fullmatch(request.path)):
            return self._scripted(request, lambda: self._get(match.group(1)))
        if request.method == "GET" and (found := TEMPLATE_PATH.fullmatch(request.path)):
            self.template_reads += 1  # neither scripted nor listed: a script is for the render requests
            if self.template_outages > 0:
                self.template_outages -= 1
                return hint(503, server.phrase(503))
            return self._template(found.group(1))
        return hint(404, f"Not found: {request.method} {request.path}")

    def _scripted(self, request: server.Request, normal: Callable[[], server.Response]) -> server.Response:
        reply = self._script.next(request.record())
        return server.answer(reply, normal, lambda status: hint(status, server.phrase(status)), malformed=b'{"id": "')

    def _submit(self, request: server.Request) -> server.Response:
        try:
            body = request.json()
        except ValueError:
            return hint(400, "The request body is not valid JSON.")
        if (error := invalid(body, self.templates)) is not None:
            return hint(400, error)
        with self._lock:
            plan = self._plans.popleft() if self._plans else Plan()
            seconds = self.render_s if plan.seconds is None else plan.seconds
            render = Render(str(uuid.uuid4()), body, plan, seconds, time.monotonic())
            self._renders[render.id] = render
        if body.get("webhook_url"):
            after, status = render.steps()[-1]
            if status in {"succeeded", "failed"}:
                label = {"id": render.id, "callbackType": status}
                payload = functools.partial(self.render, render, status)
                self._callbacks.at(render.submitted + after, body["webhook_url"], label, payload)
        return server.Response.of_json(202, self.render(render, "planned"))

    def _get(self, render_id: str) -> server.Response:
        with self._lock:
            render = self._renders.get(render_id)
        if render is None:
            return hint(404, "Render not found.")
        return server.Response.of_json(200, self.render(render))

    def _template(self, template_id: str) -> server.Response:
        """The template as the API's GET /v1/templates/{id} gives it: its RenderScript `source`, with its elements.

        The captions sit in a composition, as a template's designer may group them."""
        if self.templates is not None and template_id not in self.templates:
            return hint(404, "Template not found.")

        def element(name: str) -> dict[str, Any]:
            kind = "audio" if name == "Music" else "image" if name.startswith(("Photo-", "Logo")) else "text"
            return {"name": name, "type": kind}

        captions = sorted(name for name in self.elements if name.startswith("Caption-"))
        elements = [element(name) for name in sorted(self.elements - set(captions))]
        if captions:
            elements.append({"name": "Captions", "type": "composition", "elements": [element(n) for n in captions]})
        width, height = self.sizes.get(template_id, (WIDTH, HEIGHT))
        source = {
            "output_format": "mp4",
            "width": width,
            "height": height,
            "snapshot_time": SNAPSHOT_TIME,
            "elements": elements,
        }
        return server.Response.of_json(
            200, {"id": template_id, "name": TEMPLATE_NAME, "tags": [], "updated_at": self.updated_at, "source": source}
        )

    def render(self, render: Render, status: str | None = None) -> dict[str, Any]:
        """The render object at a status (its status now when None)."""
        status = status or render.status()
        body = render.body
        shown: dict[str, Any] = {
            "id": render.id,
            "status": status,
            "url": f"{self.url}/_fake/renders/{render.id}.mp4",
            "template_id": body["template_id"],
            "template_name": TEMPLATE_NAME,
            "output_format": "mp4",
            "render_scale": 1,
            "modifications": body.get("modifications", {}),
            "webhook_url": body.get("webhook_url"),
            "metadata": body.get("metadata"),
            "errors": [],
            "warnings": self.warnings(body.get("modifications", {})),
        }
        if status == "succeeded":
            width, height = self.sizes.get(body["template_id"], (WIDTH, HEIGHT))
            shown |= {"width": width, "height": height, "frame_rate": FRAME_RATE, "duration": DURATION_S}
            if render.plan.snapshot != "none":
                shown["snapshot_url"] = f"{self.url}/_fake/renders/{render.id}.jpg"
            shown["file_size"] = _output_size(render.plan)
        if status == "failed":
            shown["error_message"] = FAILURE
        return shown

    def warnings(self, modifications: dict[str, Any]) -> list[str]:
        """What the API warns of a render's modifications: each that matches no element of the template."""
        unmatched = sorted({name.split(".")[0] for name in modifications} - self.elements)
        return [f"The modification '{name}' matches no element of the template." for name in unmatched]

    def _fake(self, request: server.Request) -> server.Response:
        if (scripting := self._script.serve(request)) is not None:
            return scripting
        if (request.method, request.path) == ("POST", "/_fake/renders-plan"):
            try:
                self.plan(*(Plan.from_json(item) for item in request.json()))
            except (ValueError, TypeError) as error:
                return server.Response.of_json(400, {"error": f"bad plans: {error}"})
            return server.Response(204)
        if (request.method, request.path) == ("GET", "/_fake/callbacks"):
            return server.Response.of_json(200, self.callbacks)
        if request.method == "GET" and (match := OUTPUT_PATH.fullmatch(request.path)):
            with self._lock:
                render = self._renders.get(match.group(1))
            if render is not None and render.status() == "succeeded":
                if match.group(2) == "jpg" and render.plan.snapshot == "ok":
                    return server.Response(200, media.jpeg(), {"content-type": "image/jpeg"})
                if match.group(2) == "jpg":
                    return server.Response(404, b"not found", {"content-type": "text/plain"})
                return self._output(render.plan)
        return server.Response(404, b"not found", {"content-type": "text/plain"})

    def _output(self, plan: Plan) -> server.Response:
        """The rendered file like a CDN serves it (no key)."""
        if plan.output == "wrong_type":
            return server.Response(200, media.HTML_PAGE, {"content-type": "text/html"})
        video = media.mp4()
        if plan.output == "oversized":
            video = (video * (plan.size // len(video) + 1))[: plan.size]
        kind = "application/octet-stream" if plan.output == "octet_stream" else "video/mp4"
        return server.Response(200, video, {"content-type": kind})


def _output_size(plan: Plan) -> int:
    if plan.output == "wrong_type":
        return len(media.HTML_PAGE)
    return plan.size if plan.output == "oversized" else len(media.mp4())
