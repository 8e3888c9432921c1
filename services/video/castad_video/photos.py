"""The photos a brief names by URL, fetched when the video renders and kept as the pipeline's files.

A photo named by URL is fetched through the guarded outbound client (castad_runtime.outbound: https to
public addresses only, every address checked after DNS and pinned, up to MAX_REDIRECTS redirects each
checked, the identity encoding only), up to `max_bytes` within `timeout_s` for the whole answer. Its
bytes are then checked and cleaned exactly as an upload is (castad_runtime.images: decoded whole, the
pixel limit checked before any pixel is, turned upright, its metadata stripped) and only then kept in
the artifact store as a file of the pipeline's video stage (`ArtifactStore.keep_fetched`), whole or not
at all. A later attempt of the stage finds it there by its URL and fetches nothing again. Either way the
stage's completed event tells the kept file by reference (events.FetchedPhoto), so that the gateway lists
it with the pipeline's files and serves it.

What goes wrong is a stage error naming the photo (`photos[i]` and its URL, credentials in its query
masked) and the reason:

- the URL or a redirect's target is not allowed (plain http, a private, loopback or link-local
  address, too many redirects): `photo_refused`, for good;
- the answer is larger than `max_bytes`, or the image has more pixels than `max_pixels`:
  `photo_too_large`, for good;
- not an image kept here (not a JPEG, PNG or WebP, truncated, corrupt, animated, sent encoded):
  `photo_unreadable`, for good;
- the host answers 404 or another 4xx: `photo_unreachable`, for good (the photo is not there);
- no whole answer in time: `photo_timeout`, and a connection that fails or a 408, 409, 425, 429 or 5xx
  answer: `photo_unreachable`, both tried again with the next attempt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import time
from collections.abc import Iterator

import httpx
from castad_contracts import brief, codes, events
from castad_runtime import artifacts, images, outbound, redact
from castad_runtime.stage import cancellation, errors, http
from PIL import Image

MAX_REDIRECTS = 3


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a photo fetched by URL may be, and where it may come from."""

    max_bytes: int
    max_pixels: int
    timeout_s: float
    allow_private: bool = False  # plain http and private addresses too (local tests only)


@dataclasses.dataclass(frozen=True)
class Linked:
    """A photo named by URL as kept for the video: a local copy to read, and the kept file as the event tells it."""

    path: pathlib.Path
    photo: events.FetchedPhoto


@contextlib.contextmanager
def linked_copy(
    store: artifacts.ArtifactStore,
    pipeline_id: str,
    index: int,
    link: brief.PhotoLink,
    limits: Limits,
    cancel: cancellation.Cancellation,
    transport: httpx.BaseTransport | None = None,
) -> Iterator[Linked]:
    """The file of the `index`th photo of the brief, named by URL.

    Kept by an earlier attempt of the stage, or fetched, cleaned and kept now. Raises ProviderError (see the
    module's docstring).
    """
    with store.fetched_copy(pipeline_id, events.Stage.VIDEO, link.url) as earlier:
        if earlier is not None:
            yield _linked(index, link, earlier)
            return
    cleaned = fetch(index, link, limits, cancel, transport)
    store.keep_fetched(cleaned.data, pipeline_id, events.Stage.VIDEO, link.url, cleaned.media_type)
    with store.fetched_copy(pipeline_id, events.Stage.VIDEO, link.url) as kept:
        if kept is None:
            raise errors.RetryableProviderError(
                codes.ErrorCode.PHOTO_UNREACHABLE, f"{_named(index, link)}: what was kept of it is not in the store"
            )
        yield _linked(index, link, kept)


def _linked(index: int, link: brief.PhotoLink, kept: artifacts.Fetched) -> Linked:
    """The kept file of the `index`th photo, with its pixel size (read from its header: it was kept upright)."""
    with Image.open(kept.path) as opened:
        width, height = opened.size
    photo = events.FetchedPhoto(photo=index, url=link.url, file=kept.artifact, width=width, height=height)
    return Linked(kept.path, photo)


def fetch(
    index: int,
    link: brief.PhotoLink,
    limits: Limits,
    cancel: cancellation.Cancellation,
    transport: httpx.BaseTransport | None = None,
) -> images.Cleaned:
    """The `index`th photo of the brief, fetched from its URL and cleaned as an upload is.

    Nothing is kept. Raises ProviderError (see the module's docstring).
    """
    named = _named(index, link)
    data = _fetched(named, link.url, limits, cancel, transport)
    try:
        return images.clean(data, max_bytes=limits.max_bytes, max_pixels=limits.max_pixels)
    except images.TooLarge as refused:
        raise errors.PermanentProviderError(codes.ErrorCode.PHOTO_TOO_LARGE, f"{named}: the image {refused}") from None
    except images.ImageRefused as refused:
        raise errors.PermanentProviderError(codes.ErrorCode.PHOTO_UNREADABLE, f"{named}: the image {refused}") from None


def _named(index: int, link: brief.PhotoLink) -> str:
    """How an error names the photo: its place in the brief and its URL (a signature in its query masked)."""
    return f"photos[{index}] ({redact.mask(link.url)})"


def _fetched(
    named: str,
    url: str,
    limits: Limits,
    cancel: cancellation.Cancellation,
    transport: httpx.BaseTransport | None,
) -> bytes:
    def get() -> bytes:
        deadline = time.monotonic() + limits.timeout_s  # for the whole answer, not only for each read
        client = outbound.Client(
            allow_private=limits.allow_private, timeout_s=limits.timeout_s, keepalive=False, transport=transport
        )
        try:
            with client.stream("GET", url, max_redirects=MAX_REDIRECTS, deadline=deadline) as response:
                if response.status_code >= 300:
                    raise _answered(named, response)
                return outbound.read(response, limits.max_bytes, deadline)
        finally:
            client.close()

    try:
        return cancel.call(get)
    except (outbound.Refused, outbound.TooManyRedirects) as error:
        raise errors.PermanentProviderError(codes.ErrorCode.PHOTO_REFUSED, f"{named} is not allowed: {error}") from None
    except outbound.TooLarge:
        raise errors.PermanentProviderError(
            codes.ErrorCode.PHOTO_TOO_LARGE, f"{named} is larger than the {limits.max_bytes} bytes accepted"
        ) from None
    except outbound.EncodingRefused as error:
        raise errors.PermanentProviderError(
            codes.ErrorCode.PHOTO_UNREADABLE, f"{named} came encoded: {error}"
        ) from None
    except httpx.TimeoutException:
        raise errors.RetryableProviderError(
            codes.ErrorCode.PHOTO_TIMEOUT, f"{named} did not arrive within {limits.timeout_s:g} s"
        ) from None
    except httpx.RequestError as error:  # connection refused or reset, TLS, protocol errors
        raise errors.RetryableProviderError(
            codes.ErrorCode.PHOTO_UNREACHABLE, f"{named}: its host could not be reached ({redact.describe(error)})"
        ) from None


def _answered(named: str, response: httpx.Response) -> errors.ProviderError:
    """The error a host's answer other than the photo stands for: its status is said, its body is not read."""
    status = response.status_code
    if status < 400:
        return errors.PermanentProviderError(
            codes.ErrorCode.PHOTO_REFUSED, f"{named} redirected ({status}) with no place to go"
        )
    message = f"{named}: its host answered {status}"
    if status >= 500 or status in http.RETRYABLE_STATUSES:
        return errors.RetryableProviderError(
            codes.ErrorCode.PHOTO_UNREACHABLE,
            message,
            retry_after_s=http.retry_after_s(response.headers),
            status=status,
        )
    return errors.PermanentProviderError(codes.ErrorCode.PHOTO_UNREACHABLE, message, status=status)
