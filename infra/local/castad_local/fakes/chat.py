"""A local server that behaves like OpenAI's Chat Completions API, for tests and offline runs.

`POST /v1/chat/completions` checks what the real API checks (a bearer key, a model,
messages, a strict `json_schema` response format) and answers as it does: a
`chat.completion` whose message content is JSON lyrics, written by the local lyric
provider from the brief the lyric stage sends as the user message, cut off with
`finish_reason: length` where it would take more than the request's `max_completion_tokens`
(counted here as one token per character). Errors have the API's
shape (`{"error": {"message", "type", "code"}}`). Like the API, it takes no idempotency key:
every request is a new completion, whatever its headers.

What it does next can be scripted, as a test would: `POST /_fake/script` with a list of
replies (see `Reply`), served one per request before it goes back to answering well:
an error status with or without `Retry-After`, a hang, a malformed or oversized body,
a refusal, a content-filter stop, a cut-off answer. `GET /_fake/requests` lists what it
received. Run it with `python -m castad_local.fakes chat --port 8090`.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from castad_contracts import brief
from castad_lyric import provider

from castad_local.fakes import server

DEFAULT_KEY = "sk-castad-local"


@dataclasses.dataclass(frozen=True)
class Reply(server.Reply):
    """One scripted answer: a generic kind (see `server.Reply`) or refusal, content_filter, length.
    Oversized here is a completion whose content is `size` characters."""


KINDS = server.GENERIC_KINDS | {"refusal", "content_filter", "length"}


def lyrics_content(user_content: str, seed: str) -> str:
    """The lyrics JSON a model would write for the brief in the user message."""
    wanted = json.loads(user_content)
    fields = {k: wanted[k] for k in ("customer_name", "region", "detail_region_info", "language", "duration_s")}
    source = brief.Brief.model_validate(fields)
    lyrics = provider.LocalLyricProvider().write(source, seed=seed)
    return json.dumps(
        {"title": lyrics.title, "sections": [{"kind": s.kind, "lines": list(s.lines)} for s in lyrics.sections]},
        ensure_ascii=False,
    )


def completion(
    model: str, content: str | None, finish_reason: str = "stop", refusal: str | None = None
) -> dict[str, object]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": refusal},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def api_error(message: str, kind: str, code: str | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class FakeChat(server.FakeServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0, api_key: str = DEFAULT_KEY) -> None:
        self.api_key = api_key
        self._script = server.Script(Reply, KINDS)
        super().__init__(host, port)

    @property
    def received(self) -> list[dict[str, Any]]:
        """The request bodies received (the last 10,000)."""
        return self._script.received()

    def script(self, *replies: Reply) -> None:
        self._script.add(*replies)

    def handle(self, request: server.Request) -> server.Response:
        if (scripting := self._script.serve(request)) is not None:
            return scripting
        if request.path != "/v1/chat/completions" or request.method != "POST":
            return server.Response.of_json(
                404, api_error(f"Unknown request URL: {request.path}", "invalid_request_error")
            )
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            given = request.headers.get("authorization", "").removeprefix("Bearer ")
            return server.Response.of_json(
                401,
                api_error(f"Incorrect API key provided: {given[:6]}****.", "invalid_request_error", "invalid_api_key"),
            )
        try:
            body = request.json()
            model, messages, response_format = body["model"], body["messages"], body["response_format"]
            user = next(m["content"] for m in messages if m["role"] == "user")
            if response_format["type"] != "json_schema" or response_format["json_schema"].get("strict") is not True:
                raise ValueError("response_format")
        except (ValueError, KeyError, TypeError, StopIteration):
            return server.Response.of_json(400, api_error("Invalid request body.", "invalid_request_error"))
        reply = self._script.next(body)
        room = body.get("max_completion_tokens")
        if reply.kind == "ok" and isinstance(room, int) and len(lyrics_content(user, str(body.get("seed", "")))) > room:
            reply = Reply("length")  # the answer stops at the room the request gave it (a token per character here)
        return self._answer(reply, model, lambda: lyrics_content(user, str(body.get("seed", ""))))

    def _answer(self, reply: Reply, model: str, content: Callable[[], str]) -> server.Response:
        if reply.kind == "oversized":
            return server.Response.of_json(200, completion(model, "x" * reply.size))
        if reply.kind == "refusal":
            return server.Response.of_json(200, completion(model, None, refusal="I can't help with that."))
        if reply.kind == "content_filter":
            return server.Response.of_json(200, completion(model, None, finish_reason="content_filter"))
        if reply.kind == "length":
            return server.Response.of_json(200, completion(model, content()[:40], finish_reason="length"))
        return server.answer(
            reply,
            lambda: server.Response.of_json(200, completion(model, content())),
            lambda status: server.Response.of_json(status, api_error(server.phrase(status), "server_error")),
            malformed=b'{"choices": [',
        )
