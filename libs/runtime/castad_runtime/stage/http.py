"""Calling a network provider over HTTP, every failure classified for the stage machine.

A provider adapter (an LLM, a music API, a render API) sends its requests through an
`HttpProvider`, and fetches the provider's results with `download`, both through the guarded
client (castad_runtime.outbound: https only, every address checked and pinned, redirects checked,
answers capped). A request runs through the attempt's `Cancellation`, so a cancel or a
stop ends the attempt at once; the answer is read up to a size cap; and whatever goes
wrong becomes a `ProviderError` the stage machine can act on:

- no answer in time, a connection that fails, 408, 409, 429 and 5xx: retryable, waiting
  at least as long as the provider's `Retry-After` (seconds or an HTTP date) asks;
- 401 and 403 (`provider_auth`) and any other 4xx (`provider_rejected`): not retryable;
- an answer that is too large, encoded or not JSON (`provider_malformed`): retryable, a glitch may pass;
- a destination the guard refuses (`provider_url_refused`): not retryable.

An error's message is public (the tenant reads it): it says what happened in Castad's words. The
provider's own reason, or a file host's, is the error's `detail`, which only the logs get, masked.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import email.utils
import json
import logging
import pathlib
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import pydantic
from castad_contracts import codes

from castad_runtime import outages, outbound, redact
from castad_runtime.stage import cancellation, errors, machine, sniff

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 200
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})
MAX_ERROR_BODY = 65_536  # of an error answer, read for its reason


def retry_after_s(headers: Mapping[str, str], now: dt.datetime | None = None) -> float | None:
    """How long an answer asks the caller to wait.

    `retry-after-ms`, or `Retry-After` as seconds or a date; at most machine.MAX_RETRY_AFTER_S (a larger or absurd
    value is taken as that).
    """
    asked = _retry_after_s(headers, now)
    return None if asked is None else min(asked, machine.MAX_RETRY_AFTER_S)


def _retry_after_s(headers: Mapping[str, str], now: dt.datetime | None) -> float | None:
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max((when - (now or dt.datetime.now(dt.UTC))).total_seconds(), 0.0)


def reason(body: bytes) -> str:
    """The provider's own words about an error.

    `error.message`, `message`, `detail`, `msg` or `hint` of a JSON body (OpenAI, most APIs, FastAPI, sunoapi.org,
    Creatomate).
    """
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    candidates: list[Any] = []
    if isinstance(data, dict):
        error = data.get("error")
        candidates = [
            error.get("message") if isinstance(error, dict) else error,
            data.get("message"),
            data.get("detail"),
            data.get("msg"),
            data.get("hint"),
        ]
    text = next((c for c in candidates if isinstance(c, str) and c.strip()), "")
    text = redact.mask(" ".join(text.split()))
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def classify(provider: str, status: int, headers: Mapping[str, str], body: bytes) -> errors.ProviderError:
    """The ProviderError an error answer stands for (what it then costs: castad_runtime.stage.failures)."""
    said = reason(body) or None
    message = f"{provider} answered {status}"
    if status == 429 and _error_code(body) == "insufficient_quota":  # OpenAI's "out of credits": not a rate
        return errors.ProviderError(
            codes.ErrorCode.PROVIDER_CREDITS_EXHAUSTED, message, retryable=False, status=status, detail=said
        )
    if status == 429:
        return errors.ProviderError(
            codes.ErrorCode.PROVIDER_RATE_LIMITED,
            message,
            retryable=True,
            retry_after_s=retry_after_s(headers),
            status=status,
            detail=said,
        )
    if status >= 500 or status in RETRYABLE_STATUSES:
        return errors.ProviderError(
            codes.ErrorCode.PROVIDER_UNAVAILABLE,
            message,
            retryable=True,
            retry_after_s=retry_after_s(headers),
            status=status,
            detail=said,
        )
    if status in (401, 403):
        return errors.ProviderError(codes.ErrorCode.PROVIDER_AUTH, message, retryable=False, status=status, detail=said)
    return errors.ProviderError(codes.ErrorCode.PROVIDER_REJECTED, message, retryable=False, status=status, detail=said)


Classify = Callable[[str, int, Mapping[str, str], bytes], errors.ProviderError]


def _error_code(body: bytes) -> str | None:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


@dataclasses.dataclass(frozen=True)
class Credential:
    """A provider's key: a setting's value, or a file read at every call (so a mounted Secret can rotate)."""

    value: pydantic.SecretStr | None = None
    file: pathlib.Path | None = None

    def get(self) -> str:
        if self.file is not None:
            try:
                key = self.file.read_text(encoding="utf-8").strip()
            except OSError as error:
                if outages.is_resource_shortage(error):  # the machine's shortage, not the key's
                    raise
                raise errors.ProviderError(
                    codes.ErrorCode.PROVIDER_KEY_UNREADABLE,
                    "the provider's key cannot be read",
                    detail=f"{self.file}: {error.strerror}",
                ) from None
            redact.known(key)  # a rotated key is masked from its first use
            return key
        return self.value.get_secret_value() if self.value is not None else ""

    def bearer(self) -> dict[str, str]:
        """The Authorization header carrying the key (none without a key)."""
        key = self.get()
        return {"authorization": f"Bearer {key}"} if key else {}


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes

    def json(self, provider: str) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise errors.ProviderError(
                codes.ErrorCode.PROVIDER_MALFORMED, f"{provider} answered with something not JSON"
            ) from None


class HttpProvider:
    """One provider's HTTP client: base URL, timeout, answer size cap and credentials per request.

    `allow_private` lets it reach a provider at a private address or over plain http (local fakes);
    `transport` replaces the guarded one (tests answering in memory); `classify` reads an error answer
    (a provider whose codes mean other things than HTTP's: sunoapi.org's 429 is credits, not a rate)."""

    def __init__(
        self,
        name: str,
        base_url: str,
        timeout_s: float,
        max_body_bytes: int,
        headers: Callable[[], Mapping[str, str]] = dict,
        transport: httpx.BaseTransport | None = None,
        *,
        allow_private: bool = False,
        classify: Classify = classify,
    ) -> None:
        self.name = name
        self._classify = classify
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self._headers = headers
        # Only the guarded transport connects through httpcore, whose trace hook lets the fence run once the
        # connection is made; a transport that answers in memory is fenced before it is called.
        self._fence_on_send = transport is None
        self._client = outbound.Client(
            allow_private=allow_private, timeout_s=timeout_s, base_url=base_url, transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def json(self, method: str, path: str, cancel: cancellation.Cancellation, **kwargs: Any) -> Any:
        """Send a request and return its JSON answer; raise ProviderError for anything else."""
        return self.send(method, path, cancel, **kwargs).json(self.name)

    def submit(self, path: str, cancel: cancellation.Cancellation, **kwargs: Any) -> Any:
        """POST a request that starts work at the provider (paid for) and return its JSON answer.

        It goes only past the attempt's fence (`Cancellation.leaving`), checked as late as the HTTP
        client allows: once the name is resolved, the connection made and TLS set up (or a kept-alive
        connection taken), as httpcore starts writing the request's headers (its `trace` hook). An
        attempt that no longer holds its job by then sends nothing, however long the connect took."""
        return self.send("POST", path, cancel, leaving=True, **kwargs).json(self.name)

    def send(
        self, method: str, path: str, cancel: cancellation.Cancellation, *, leaving: bool = False, **kwargs: Any
    ) -> Answer:
        """Send a request and return a successful answer (2xx).

        Raise ProviderError for anything else. `leaving`: it starts work at the provider, and goes only past the
        attempt's fence.
        """
        headers = {**self._headers(), **kwargs.pop("headers", {})}  # a key file read before, not after, the fence
        if leaving and self._fence_on_send:
            cancel.check()
            kwargs["extensions"] = {**kwargs.get("extensions", {}), "trace": _fence_before_headers(cancel)}
        elif leaving:
            cancel.leaving()
        try:
            answer = cancel.call(lambda: self._exchange(method, path.lstrip("/"), headers, **kwargs))
        except outbound.Refused as error:
            raise errors.ProviderError(
                codes.ErrorCode.PROVIDER_URL_REFUSED,
                f"{self.name} is at an address that is not allowed",
                retryable=False,
                detail=str(error),
            ) from None
        except httpx.TimeoutException:
            raise errors.ProviderError(
                codes.ErrorCode.PROVIDER_TIMEOUT, f"{self.name} did not answer within {self.timeout_s:g} s"
            ) from None
        except (httpx.DecodingError, outbound.EncodingRefused) as error:
            raise errors.ProviderError(
                codes.ErrorCode.PROVIDER_MALFORMED,
                f"{self.name} sent a mis-encoded body",
                detail=redact.describe(error),
            ) from None
        except httpx.RequestError as error:  # connection refused or reset, TLS, protocol errors
            raise errors.ProviderError(
                codes.ErrorCode.PROVIDER_UNREACHABLE, f"{self.name} could not be reached", detail=redact.describe(error)
            ) from None
        except outbound.TooLarge:
            raise errors.ProviderError(
                codes.ErrorCode.PROVIDER_MALFORMED, f"{self.name} answered with more than {self.max_body_bytes} bytes"
            ) from None
        if answer.status >= 400:
            raise self._classify(self.name, answer.status, answer.headers, answer.body)
        if answer.status >= 300:
            raise errors.ProviderError(
                codes.ErrorCode.PROVIDER_REJECTED, f"{self.name} redirected ({answer.status})", retryable=False
            )
        return answer

    def _exchange(self, method: str, path: str, headers: Mapping[str, str], **kwargs: Any) -> Answer:
        deadline = time.monotonic() + self.timeout_s  # for the whole answer, not only for each read
        with self._client.stream(method, path, headers=headers, deadline=deadline, **kwargs) as response:
            body = outbound.read(response, self.max_body_bytes, deadline)
            return Answer(response.status_code, response.headers, body)


SENDING_HEADERS = frozenset({"http11.send_request_headers.started", "http2.send_request_headers.started"})


def _fence_before_headers(cancel: cancellation.Cancellation) -> Callable[[str, dict[str, Any]], None]:
    """httpcore's trace hook that passes the attempt's fence just before the request's first byte.

    What it raises (Fenced, Cancelled) ends the request there, before the first byte is written: nothing is sent.
    """

    def trace(event: str, info: dict[str, Any]) -> None:
        if event in SENDING_HEADERS:
            cancel.leaving()

    return trace


@dataclasses.dataclass(frozen=True)
class Download:
    media_type: str
    size: int


MAX_REDIRECTS = 3


def download(
    url: str,
    dest: pathlib.Path,
    cancel: cancellation.Cancellation,
    *,
    media_types: tuple[str, ...],
    max_bytes: int,
    timeout_s: float,
    allow_private: bool = False,
    transport: httpx.BaseTransport | None = None,
) -> Download:
    """Fetch a provider's result (an audio or video file at a URL it gave) into `dest`.

    The URL is the provider's word: it goes through the guarded client like any call, with up to
    MAX_REDIRECTS redirects each checked, and a destination the guard refuses (a private address,
    plain http) is `provider_url_refused`, not retryable: nothing is fetched. No credentials go with
    it (the URL is often another host's, a CDN's). The answer must be one of `media_types` (e.g.
    "audio/", a prefix, or "video/mp4") by its bytes (castad_runtime.stage.sniff: a CDN may say
    `application/octet-stream` of an MP3, or `audio/mpeg` of an error page; a header that disagrees
    is logged), and at most `max_bytes`; what is not is `provider_artifact_invalid`, retryable with a
    new attempt. Any error answer of the file host (a
    CDN still propagating, an expired link, a 5xx) is `provider_unavailable`: the result is fetched
    again at the next poll (see castad_runtime.stage.remote), and it says nothing of the provider's quota.
    """
    where = _where(url)

    def fetch() -> Download:
        deadline = time.monotonic() + timeout_s
        client = outbound.Client(allow_private=allow_private, timeout_s=timeout_s, keepalive=False, transport=transport)
        try:
            with client.stream("GET", url, max_redirects=MAX_REDIRECTS, deadline=deadline) as response:
                if response.status_code >= 300:
                    raise _host_error(response, deadline)
                declared = response.headers.get("content-type", "").split(";")[0].strip().lower()
                with dest.open("wb") as out:
                    size = outbound.write_to(response, out, max_bytes, deadline)
        finally:
            client.close()
        if size == 0:
            raise errors.ProviderError(codes.ErrorCode.PROVIDER_ARTIFACT_INVALID, "the result is empty")
        with dest.open("rb") as written:
            found = sniff.media_type(written.read(sniff.HEAD_BYTES))
        if found is None or not found.startswith(media_types):
            raise errors.ProviderError(
                codes.ErrorCode.PROVIDER_ARTIFACT_INVALID,
                f"the result is {found or 'of no known kind'} by its bytes, not {' or '.join(media_types)}",
                detail=f"{where}: served as {declared[:60] or 'untyped'}",
            )
        if declared != found:
            log.warning(
                "%s: served as %s, by its bytes %s: kept as %s", where, declared[:60] or "untyped", found, found
            )
        return Download(found, size)

    try:
        return cancel.call(fetch)
    except outbound.Refused as error:
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_URL_REFUSED,
            "the result's URL is not allowed",
            retryable=False,
            detail=f"{where}: {error}",
        ) from None
    except outbound.TooLarge:
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_ARTIFACT_INVALID, f"the result is larger than {max_bytes} bytes"
        ) from None
    except outbound.EncodingRefused as error:
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_ARTIFACT_INVALID, "the result came encoded", detail=str(error)
        ) from None
    except outbound.TooManyRedirects:
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_ARTIFACT_INVALID, "the result's URL redirects too often"
        ) from None
    except httpx.TimeoutException:
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_TIMEOUT, f"the result did not arrive within {timeout_s:g} s"
        ) from None
    except httpx.RequestError as error:
        detail = f"{where}: {redact.describe(error)}"
        raise errors.ProviderError(
            codes.ErrorCode.PROVIDER_UNREACHABLE, "the result's host could not be reached", detail=detail
        ) from None


def _where(url: str) -> str:
    """The URL's scheme, host and path for the logs (its query often holds a signature)."""
    parsed = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parsed.scheme, parsed.hostname or "", parsed.path, "", ""))[:300]


def _host_error(response: httpx.Response, deadline: float) -> errors.ProviderError:
    """A file host's error answer (or a redirect not followed): its status is public, what it said is not."""
    try:
        said = reason(outbound.read(response, MAX_ERROR_BODY, deadline))
    except (outbound.TooLarge, httpx.HTTPError):
        said = ""
    if response.status_code < 400:
        return errors.ProviderError(
            codes.ErrorCode.PROVIDER_ARTIFACT_INVALID,
            f"the result's URL redirected ({response.status_code}) with no place to go",
        )
    return errors.ProviderError(
        codes.ErrorCode.PROVIDER_UNAVAILABLE,
        f"the provider's file host answered {response.status_code}",
        retry_after_s=retry_after_s(response.headers),
        status=response.status_code,
        detail=said or None,
    )
