"""A local server that behaves like the sunoapi.org Suno API (v1), for tests and offline runs.

`POST /api/v1/generate` checks a bearer key and the body as the API's reference does (`customMode`,
`instrumental`, `model` and `callBackUrl` required; in custom mode lyrics as `prompt`, a `style`, a
`title`, each within its model's length: code 413 past it) and answers with a `taskId`;
`GET /api/v1/generate/record-info` reports the task. A task moves by the time since it was
submitted (`song_s`): PENDING, TEXT_SUCCESS after a third, FIRST_SUCCESS after two thirds (the
first track streams), SUCCESS at the end (two tracks, each an MP3 of `audio_s` seconds under `/_fake/audio/`). With a
`callBackUrl`, each step is also posted there (text, first, complete or error) from one
background thread (not to a host under `.invalid`, which never resolves). Errors are the API's:
HTTP 200 with the error in the body's `code`, or (scripted, as the API's overview says it may) the
same code as the HTTP status too. A task whose callback could not be delivered ends as
CALLBACK_EXCEPTION with its tracks made. Like the API, it takes no idempotency key and lists no
tasks: every valid generate is a new task. With `listed_after_s`, record-info says "not found" for a task that
young, as the API's users report it does for fresh tasks.

Tests script it: `POST /_fake/script` queues replies for the next API requests (see `Reply`:
an HTTP status with or without Retry-After, an error `code` in the body, a hang, a malformed or
oversized body); `POST /_fake/tasks` plans the next tasks (see `Plan`: failing, refused for
sensitive words, never finishing, serving audio of the wrong type or size). `GET /_fake/requests`
and `GET /_fake/callbacks` list what it received and posted. Run it with
`python -m castad_local.fakes suno --port 8091`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

from castad_local.fakes import media, server

DEFAULT_KEY = "suno-castad-local"
MODELS = frozenset({"V3_5", "V4", "V4_5", "V4_5PLUS", "V4_5ALL", "V5"})
OLD_MODELS = frozenset({"V3_5", "V4"})  # the generate reference: shorter prompts and styles than the newer ones
LIMITS = {"prompt": 5000, "style": 1000, "title": 80}
OLD_LIMITS = {"prompt": 3000, "style": 200, "title": 80}
DESCRIPTION_LIMIT = 500  # the prompt outside custom mode
CODE_MESSAGES = {
    400: "Invalid parameters",
    401: "Unauthorized",
    404: "Not found",
    405: "Rate limit exceeded",
    413: "Theme or prompt too long",
    429: "Insufficient credits",
    430: "Your call frequency is too high. Please try again later.",
    455: "System maintenance",
    500: "Server error",
}

PENDING, TEXT, FIRST, SUCCESS = "PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS", "SUCCESS"
AUDIO_FAILED, SENSITIVE = "GENERATE_AUDIO_FAILED", "SENSITIVE_WORD_ERROR"
CALLBACK_EXCEPTION = "CALLBACK_EXCEPTION"  # "Error occurred during callback": the songs were made
ERRORS = {AUDIO_FAILED: "Audio generation failed.", SENSITIVE: "The lyrics contain sensitive words."}
MADE = frozenset({SUCCESS, CALLBACK_EXCEPTION})  # the tracks are whole
CALLBACKS = {TEXT: ("text", "Text generation completed."), FIRST: ("first", "First track generation completed.")}
CALLBACKS[SUCCESS] = ("complete", "All generated successfully.")

AUDIO_PATH = re.compile(r"/_fake/(audio|stream|image)/([0-9a-f]{32})/([12])(?:\.mp3|\.jpeg)?")


@dataclasses.dataclass(frozen=True)
class Reply(server.Reply):
    """One scripted answer: a generic kind (see `server.Reply`) or `code`, HTTP 200 with
    `{"code": code, "msg": msg}` (msg: the API's own for the code when not given); with `in_status`
    the HTTP status is the code too (and `retry_after` its Retry-After)."""

    code: int = 0
    msg: str | None = None
    in_status: bool = False


KINDS = server.GENERIC_KINDS | {"code"}


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one task goes. `outcome`: ok, fail (audio generation fails), sensitive (refused for its
    words), never (pending for ever), callback_exception (its songs made, its callback not delivered:
    CALLBACK_EXCEPTION); `audio`: ok, wrong_type (an HTML page), oversized (`size` bytes),
    octet_stream (the MP3 as `application/octet-stream`, as a CDN may serve it); `seconds`: how long
    it takes (the fake's `song_s` when None); `audio_s`: how long its songs last (the fake's
    `audio_s` when None)."""

    outcome: str = "ok"
    audio: str = "ok"
    seconds: float | None = None
    size: int = 0
    audio_s: float | None = None

    def __post_init__(self) -> None:
        if self.outcome not in {"ok", "fail", "sensitive", "never", "callback_exception"}:
            raise ValueError(f"unknown outcome {self.outcome!r}")
        if self.audio not in {"ok", "wrong_type", "oversized", "octet_stream"}:
            raise ValueError(f"unknown audio {self.audio!r}")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class Task:
    """A submitted task; its status is read off the time since `submitted`."""

    id: str
    body: dict[str, Any]
    plan: Plan
    seconds: float
    submitted: float  # time.monotonic()
    created_ms: int
    track_ids: tuple[str, str]

    def steps(self) -> list[tuple[float, str]]:
        """(seconds after submitting, status) of every status it goes through."""
        third = self.seconds / 3
        return {
            "ok": [(0.0, PENDING), (third, TEXT), (2 * third, FIRST), (self.seconds, SUCCESS)],
            "fail": [(0.0, PENDING), (third, TEXT), (self.seconds, AUDIO_FAILED)],
            "sensitive": [(0.0, PENDING), (third, SENSITIVE)],
            "never": [(0.0, PENDING)],
            "callback_exception": [
                (0.0, PENDING),
                (third, TEXT),
                (2 * third, FIRST),
                (self.seconds, CALLBACK_EXCEPTION),
            ],
        }[self.plan.outcome]

    def status(self) -> str:
        elapsed = time.monotonic() - self.submitted
        return [status for after, status in self.steps() if after <= elapsed][-1]

    @property
    def model_name(self) -> str:
        return "chirp-" + str(self.body["model"]).lower().replace("_", "-")


def envelope(code: int, msg: str, data: Any = None) -> dict[str, Any]:
    return {"code": code, "msg": msg, "data": data}


def invalid(body: Any) -> str | None:
    """What is wrong with a generate body, None when nothing is."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    for flag in ("customMode", "instrumental"):
        if not isinstance(body.get(flag), bool):
            return f"{flag} is required and must be a boolean"
    if body.get("model") not in MODELS:
        return f"model must be one of {', '.join(sorted(MODELS))}"
    url = body.get("callBackUrl")
    if not isinstance(url, str) or not url:
        return "Please enter callBackUrl."  # required on every generate (the reference's requiredProperties)
    if not url.startswith(("http://", "https://")):
        return "callBackUrl must be an http(s) URL"
    if not body["customMode"]:
        return _text_error(body, "prompt", DESCRIPTION_LIMIT)
    limits = OLD_LIMITS if body["model"] in OLD_MODELS else LIMITS
    needed = ["style", "title"] + ([] if body["instrumental"] else ["prompt"])
    return next((error for name in needed if (error := _text_error(body, name, limits[name]))), None)


def error_code(problem: str) -> int:
    """The code the API answers a generate body's problem with: 413 for a text too long, else 400."""
    return 413 if " is too long" in problem else 400


def _text_error(body: dict[str, Any], name: str, limit: int) -> str | None:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        return f"{name} is required"
    if len(value) > limit:
        return f"{name} is too long: {len(value)} characters, at most {limit}"
    return None


class FakeSuno(server.FakeServer):
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str = DEFAULT_KEY,
        song_s: float = 30.0,
        audio_s: float = 6.0,
        listed_after_s: float = 0.0,
    ) -> None:
        self.api_key = api_key
        self.song_s = song_s
        self.audio_s = audio_s
        self.listed_after_s = listed_after_s  # record-info says "not found" for a task younger than this
        self._script = server.Script(Reply, KINDS)
        self._plans: collections.deque[Plan] = collections.deque()
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        self._callbacks = server.Callbacks()
        super().__init__(host, port)

    @property
    def received(self) -> list[dict[str, Any]]:
        """The API requests received (method, path, query, body), the last 10,000."""
        return self._script.received()

    @property
    def tasks_made(self) -> int:
        """How many generate requests it took (each a task, as the API bills them)."""
        with self._lock:
            return len(self._tasks)

    @property
    def callbacks(self) -> list[dict[str, Any]]:
        """The callbacks posted: url, id, callbackType, and the answer's status or the error."""
        return self._callbacks.sent()

    def script(self, *replies: Reply) -> None:
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
            return server.Response.of_json(401, envelope(401, "Unauthorized"))
        if (request.method, request.path) == ("POST", "/api/v1/generate"):
            return self._scripted(request, lambda: self._generate(request))
        if (request.method, request.path) == ("GET", "/api/v1/generate/record-info"):
            return self._scripted(request, lambda: self._record_info(request))
        return server.Response.of_json(404, envelope(404, f"Not found: {request.method} {request.path}"))

    def _scripted(self, request: server.Request, normal: Callable[[], server.Response]) -> server.Response:
        reply = self._script.next(request.record())
        if reply.kind == "code":
            said = envelope(reply.code, reply.msg or CODE_MESSAGES.get(reply.code, ""))
            retry = {"retry-after": reply.retry_after} if reply.retry_after else {}
            return server.Response.of_json(reply.code if reply.in_status else 200, said, retry)
        return server.answer(
            reply,
            normal,
            lambda status: server.Response.of_json(status, envelope(status, server.phrase(status))),
            malformed=b'{"code": 200, "msg": "success", "data": {',
        )

    def _generate(self, request: server.Request) -> server.Response:
        try:
            body = request.json()
        except ValueError:
            body = None
        if (error := invalid(body)) is not None:
            return server.Response.of_json(200, envelope(error_code(error), error))
        with self._lock:
            plan = self._plans.popleft() if self._plans else Plan()
            seconds = self.song_s if plan.seconds is None else plan.seconds
            task = Task(
                uuid.uuid4().hex,
                body,
                plan,
                seconds,
                time.monotonic(),
                int(time.time() * 1000),
                (str(uuid.uuid4()), str(uuid.uuid4())),
            )
            self._tasks[task.id] = task
        if body.get("callBackUrl"):
            self._schedule_callbacks(task, body["callBackUrl"])
        return server.Response.of_json(200, envelope(200, "success", {"taskId": task.id}))

    def _record_info(self, request: server.Request) -> server.Response:
        task_id = (urllib.parse.parse_qs(request.query).get("taskId") or [""])[0]
        if not task_id:
            return server.Response.of_json(200, envelope(400, "taskId is required"))
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None or time.monotonic() - task.submitted < self.listed_after_s:
            return server.Response.of_json(200, envelope(404, "task not found"))
        return server.Response.of_json(200, envelope(200, "success", self.details(task, task.status())))

    def details(self, task: Task, status: str) -> dict[str, Any]:
        """The record-info `data` of a task at a status."""
        running = status in {TEXT, FIRST} | MADE
        return {
            "taskId": task.id,
            "parentMusicId": "",
            "param": json.dumps(task.body, ensure_ascii=False),
            "response": {"taskId": task.id, "sunoData": self.tracks(task, status)} if running else None,
            "status": status,
            "type": task.model_name,
            "operationType": "generate",
            "errorCode": None,
            "errorMessage": ERRORS.get(status),
        }

    def tracks(self, task: Task, status: str) -> list[dict[str, Any]]:
        """The two tracks as record-info shows them: streaming from FIRST_SUCCESS (the first), whole at SUCCESS."""
        return [
            {
                "id": track_id,
                "audioUrl": self._media_url("audio", task, n) if status in MADE else "",
                "streamAudioUrl": self._media_url("stream", task, n) if _streams(status, n) else "",
                "imageUrl": self._media_url("image", task, n),
                "prompt": task.body.get("prompt", ""),
                "modelName": task.model_name,
                "title": task.body.get("title", ""),
                "tags": task.body.get("style", ""),
                "createTime": task.created_ms,
                "duration": float(task.plan.audio_s or self.audio_s),
            }
            for n, track_id in enumerate(task.track_ids, start=1)
        ]

    def _media_url(self, kind: str, task: Task, n: int) -> str:
        suffix = {"audio": ".mp3", "image": ".jpeg", "stream": ""}[kind]
        return f"{self.url}/_fake/{kind}/{task.id}/{n}{suffix}"

    def _schedule_callbacks(self, task: Task, url: str) -> None:
        if (urllib.parse.urlsplit(url).hostname or "").endswith(".invalid"):  # RFC 6761: never resolves
            return
        for after, status in task.steps()[1:]:
            if status == CALLBACK_EXCEPTION:  # what the API says when its callback did not go through
                continue
            kind = CALLBACKS.get(status, ("error", ""))[0]
            label = {"id": task.id, "callbackType": kind}
            self._callbacks.at(task.submitted + after, url, label, functools.partial(self.callback, task, status))

    def callback(self, task: Task, status: str) -> dict[str, Any]:
        """What is posted to the callBackUrl when a task reaches a status."""
        if status in ERRORS:
            return envelope(501, ERRORS[status], {"callbackType": "error", "task_id": task.id, "data": None})
        kind, msg = CALLBACKS[status]
        tracks = [
            {
                "id": track["id"],
                "audio_url": track["audioUrl"],
                "stream_audio_url": track["streamAudioUrl"],
                "image_url": track["imageUrl"],
                "prompt": track["prompt"],
                "model_name": track["modelName"],
                "title": track["title"],
                "tags": track["tags"],
                "createTime": track["createTime"],
                "duration": track["duration"],
            }
            for track in self.tracks(task, status)
        ]
        return envelope(200, msg, {"callbackType": kind, "task_id": task.id, "data": tracks})

    def _fake(self, request: server.Request) -> server.Response:
        if (scripting := self._script.serve(request)) is not None:
            return scripting
        if (request.method, request.path) == ("POST", "/_fake/tasks"):
            try:
                self.plan(*(Plan.from_json(item) for item in request.json()))
            except (ValueError, TypeError) as error:
                return server.Response.of_json(400, {"error": f"bad plans: {error}"})
            return server.Response(204)
        if (request.method, request.path) == ("GET", "/_fake/callbacks"):
            return server.Response.of_json(200, self.callbacks)
        if request.method == "GET" and (match := AUDIO_PATH.fullmatch(request.path)):
            return self._media(*match.groups())
        return server.Response(404, b"not found", {"content-type": "text/plain"})

    def _media(self, kind: str, task_id: str, number: str) -> server.Response:
        """A track's MP3 (or cover) like a CDN: no key, and only once record-info shows its URL."""
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None:
            return server.Response(404, b"not found", {"content-type": "text/plain"})
        n, status = int(number), task.status()
        if kind == "image" and status in {TEXT, FIRST} | MADE:
            return server.Response(200, media.jpeg(), {"content-type": "image/jpeg"})
        if (kind == "audio" and status in MADE) or (kind == "stream" and _streams(status, n)):
            return self._audio(task.plan)
        return server.Response(404, b"not found", {"content-type": "text/plain"})

    def _audio(self, plan: Plan) -> server.Response:
        if plan.audio == "wrong_type":
            return server.Response(200, media.HTML_PAGE, {"content-type": "text/html"})
        audio = media.mp3(plan.audio_s or self.audio_s)
        if plan.audio == "oversized":
            audio = (audio * (plan.size // len(audio) + 1))[: plan.size]
        kind = "application/octet-stream" if plan.audio == "octet_stream" else "audio/mpeg"
        return server.Response(200, audio, {"content-type": kind})


def _streams(status: str, n: int) -> bool:
    return status in MADE or (status == FIRST and n == 1)
