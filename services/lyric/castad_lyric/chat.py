"""Lyrics from an LLM: any server speaking OpenAI's Chat Completions API.

One request per attempt: `POST {base_url}/chat/completions` with the brief as JSON in the
user message and a strict JSON Schema as `response_format`, so the answer is the lyrics
as data. The answer is validated into the lyrics model; what the model refuses to write
(`refusal`, or `finish_reason: content_filter`) fails for good, as do 400, 401, 403 and
404; a rate limit, a server error, a timeout or an answer that does not fit is retried
(after the server's `Retry-After` when it sends one). See castad_runtime.stage.http, and what each error
costs an attempt: castad_runtime.stage.failures.

Each request says how many tokens the answer may take (`max_completion_tokens`): room for the lyrics asked for
(`room`), so a server's own small default does not cut them off. An answer cut off all the same
(`finish_reason: length`) is retried with twice the room (the room grows with the job's attempts, operator
retries included), never as the same request, which would be cut off again and paid again; cut off with the most
room (`MAX_ROOM`), it fails for good.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from castad_contracts import brief, codes, events
from castad_runtime import redact
from castad_runtime.stage import cancellation, errors, http
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from castad_lyric import provider

Line = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=events.MAX_LINE_CHARS)]

SYSTEM_PROMPT = (
    "You write the lyrics of a short, catchy marketing song for a local business. The user message is the"
    " brief as JSON. Write every word in the brief's `language`. Sing the business's name (customer_name)"
    " and its region by name, use what detail_region_info says about the place, and fit the genre. Follow"
    " `sections` in order, each with about `lines_per_section` short singable lines (at most"
    " `max_chars_per_line` characters). If `change_asked` is given, a person read an earlier draft and asks for"
    " that change: write new lyrics that make it. Answer with the JSON the schema asks for, nothing else."
)

RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "lyrics",
        "strict": True,
        "schema": {
            "type": "object",
            "additionalProperties": False,
            "required": ["title", "sections"],
            "properties": {
                "title": {"type": "string"},
                "sections": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["kind", "lines"],
                        "properties": {
                            "kind": {"type": "string", "enum": ["verse", "chorus", "bridge"]},
                            "lines": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                },
            },
        },
    },
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["verse", "chorus", "bridge"]
    lines: list[Line] = Field(min_length=1, max_length=events.MAX_SECTION_LINES)


class _Written(BaseModel):
    """The answer's content, as the schema asks for it."""

    model_config = ConfigDict(extra="forbid")

    title: Line
    sections: list[_Section] = Field(min_length=1, max_length=events.MAX_SECTIONS)


MAX_CHARS_PER_LINE = 40
ROOM_PER_CHAR = 2  # tokens per character asked for: Hangul takes one or two in the tokenizers of the GPT models
ROOM_FOR_JSON = 256  # the title and the JSON around the lines
MAX_ROOM = 16_384


def room(sections: int, lines_per_section: int, attempt: int = 1) -> int:
    """The tokens an answer may take: the lyrics asked for, twice that for each attempt after the first."""
    asked = sections * lines_per_section * MAX_CHARS_PER_LINE * ROOM_PER_CHAR + ROOM_FOR_JSON
    return min(MAX_ROOM, asked << min(max(attempt, 1) - 1, 8))


def request_body(
    source: brief.Brief, seed: str, model: str, attempt: int = 1, note: str | None = None
) -> dict[str, Any]:
    """The request of a pipeline's `attempt`: the same for the same pipeline, but for its room (`room`).

    `note`: what a person reviewing the last draft asked to change (`change_asked`), for a new draft."""
    kinds = provider.structure(source.duration_s)
    lines = provider.lines_per_section(source.duration_s, len(kinds))
    wanted = {
        **source.model_dump(mode="json", include={"customer_name", "region", "detail_region_info", "language"}),
        "genre": str(source.genre),
        "duration_s": source.duration_s,
        "sections": list(kinds),
        "lines_per_section": lines,
        "max_chars_per_line": MAX_CHARS_PER_LINE,
        **({"change_asked": note} if note else {}),
    }
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": json.dumps(wanted, ensure_ascii=False)},
        ],
        "response_format": RESPONSE_FORMAT,
        "max_completion_tokens": room(len(kinds), lines, attempt),
        # The same pipeline asks the same way on every attempt (servers that support it repeat themselves).
        "seed": int.from_bytes(hashlib.sha256(seed.encode()).digest()[:4], "big"),
    }


def lyrics_of(answer: Any, language: brief.Language) -> events.Lyrics:
    """The lyrics in a Chat Completions answer; ProviderError when there are none."""
    try:
        choice = answer["choices"][0]
        message = choice["message"]
        refusal, content, finish = message.get("refusal"), message.get("content"), choice.get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise errors.ProviderError(codes.ErrorCode.PROVIDER_MALFORMED, "the answer has no choices[0].message") from None
    if refusal:
        raise errors.ProviderError(
            codes.ErrorCode.CONTENT_REFUSED,
            "the model refused to write the lyrics",
            retryable=False,
            detail=str(refusal)[:200],
        )
    if finish == "content_filter":
        raise errors.ProviderError(
            codes.ErrorCode.CONTENT_FILTERED, "the server's content filter stopped the lyrics", retryable=False
        )
    if finish == "length":
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_TRUNCATED,
            "the lyrics were cut off at the token limit (the next attempt gives them twice the room)",
        )
    if not isinstance(content, str):
        raise errors.ProviderError(codes.ErrorCode.PROVIDER_MALFORMED, "the answer's message has no content")
    try:
        written = _Written.model_validate_json(content)
    except ValidationError as error:
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_MALFORMED, f"the lyrics do not fit: {redact.validation_summary(error, 3)}"
        ) from None
    sections = tuple(events.LyricSection(kind=s.kind, lines=tuple(s.lines)) for s in written.sections)
    return events.Lyrics(title=written.title, language=language, sections=sections)


class ChatLyricProvider:
    """Writes lyrics with an OpenAI-compatible Chat Completions server."""

    def __init__(self, client: http.HttpProvider, model: str) -> None:
        self._client = client
        self._model = model

    def write(
        self,
        source: brief.Brief,
        seed: str,
        cancel: cancellation.Cancellation,
        attempt: int = 1,
        note: str | None = None,
    ) -> events.Lyrics:
        # The API takes no idempotency key (docs/providers.md): past the fence, a request is a new completion.
        body = request_body(source, seed, self._model, attempt, note)
        answer = self._client.submit("chat/completions", cancel, json=body)
        try:
            return lyrics_of(answer, source.language)
        except errors.ProviderError as error:
            if error.code != codes.ErrorCode.PROVIDER_TRUNCATED or body["max_completion_tokens"] < MAX_ROOM:
                raise
            raise errors.ProviderError(
                codes.ErrorCode.PROVIDER_TRUNCATED,
                f"the lyrics were cut off even with the most room Castad gives them ({MAX_ROOM} tokens)",
                retryable=False,
            ) from None
