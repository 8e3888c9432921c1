"""Server-Sent Events that follow timelines.

Each read again only when the gateway's listener (or its sweep) says its pipeline changed (notifications.py), on a
clock of CASTAD_API_SSE_POLL_S while the listener is not listening, and kept open through an outage of the
gateway's database; each held by its API key's place (stream_keys.py), ended once that key is revoked. An idle
stream costs its keep-alive comments, no reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import re
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Generic, TypeVar

from castad_contracts import api
from castad_runtime import outages
from fastapi import Header, HTTPException, status
from fastapi.concurrency import run_in_threadpool

from castad_api import deps, errors, keys, stream_keys

Cursor = TypeVar("Cursor")
LastEventId = Annotated[
    str | None, Header(alias="Last-Event-ID", description="resume after the event of this id (one this stream sent)")
]
TOO_MANY: dict[int | str, dict[str, Any]] = {
    429: {
        "model": api.Problem,
        "description": "the key holds as many event streams open as it may (CASTAD_API_SSE_STREAMS_PER_KEY; see"
        " Retry-After), or its client address failed authentication too often",
    }
}


def admit(gw: deps.Gateway, who: keys.Principal) -> stream_keys.Lease:
    """A place for one more stream of the caller's key; a 429 with Retry-After beyond its cap."""
    try:
        return gw.stream_keys.admit(who.key_id)
    except stream_keys.TooMany:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"this key holds {gw.config.sse_streams_per_key} event streams open already: close one",
            {"Retry-After": str(stream_keys.RETRY_AFTER_S)},
        ) from None


def resumes_after(last_event_id: str | None) -> int | None:
    """The seq a stream resumes after, from its Last-Event-ID header (None: not resumed)."""
    if not last_event_id:
        return None
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if not re.fullmatch(r"[0-9]{1,18}", last_event_id):
        raise errors.invalid(("header", "Last-Event-ID"), "must be an id this stream sent", last_event_id)
    return int(last_event_id)


@dataclasses.dataclass(frozen=True)
class Batch(Generic[Cursor]):
    """What one read found: messages to send, where the next read starts, and whether to go on."""

    messages: list[dict[str, Any]]
    cursor: Cursor
    more: bool = False  # the read was cut at its limit: read again at once
    ended: bool = False  # nothing more will come: close the stream
    again_s: float | None = None  # read again within this long, even if nothing wakes the stream


def follow(
    gw: deps.Gateway,
    lease: stream_keys.Lease,
    subscription: str,
    read: Callable[[Cursor], Batch[Cursor]],
    cursor: Cursor,
    lifetime_s: float | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Send what `read` finds from `cursor` on, reading again whenever `subscription` is notified.

    `subscription` is a pipeline id, or notifications.EVERY_PIPELINE. It goes on until a batch says it ended,
    `lifetime_s` is over or the key that holds `lease` is revoked. Counted among the open streams
    (castad_sse_streams_open) meanwhile; the lease is given back at its end (or once it is freed, if it never
    began).
    """
    stream = _held(gw, lease, subscription, read, cursor, lifetime_s)
    lease.bind(stream)
    return stream


async def _held(
    gw: deps.Gateway,
    lease: stream_keys.Lease,
    subscription: str,
    read: Callable[[Cursor], Batch[Cursor]],
    cursor: Cursor,
    lifetime_s: float | None,
) -> AsyncIterator[dict[str, Any]]:
    try:
        with gw.metrics.streams.track_inprogress():
            async for message in _follow(gw, lease, subscription, read, cursor, lifetime_s):
                yield message
    finally:
        lease.release()


async def _follow(
    gw: deps.Gateway,
    lease: stream_keys.Lease,
    subscription: str,
    read: Callable[[Cursor], Batch[Cursor]],
    cursor: Cursor,
    lifetime_s: float | None,
) -> AsyncIterator[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    closes_at = None if lifetime_s is None else loop.time() + lifetime_s
    # Subscribed for the stream's life, before its first read: a projection committed after a read wakes the wait
    # after it. The key's revocation wakes it too.
    with gw.notifications.subscribe(subscription) as woken, gw.stream_keys.watching(lease.key_id, woken):
        while closes_at is None or loop.time() < closes_at:
            if not await gw.stream_keys.valid(lease.key_id):
                return  # revoked: the stream ends (a client that reconnects with it gets a 401)
            woken.clear()
            try:
                batch = await run_in_threadpool(read, cursor)
            except Exception as error:
                if not outages.is_outage(error):
                    raise
                # The database is out: keep the stream (keep-alives go on) and read again later.
                await _wait(woken, gw.config.sse_poll_s)
                continue
            for message in batch.messages:
                yield message
            cursor = batch.cursor
            if batch.ended:
                return
            if batch.more:
                continue
            wait_s = None if gw.notifications.listening else gw.config.sse_poll_s
            if batch.again_s is not None:
                wait_s = batch.again_s if wait_s is None else min(wait_s, batch.again_s)
            if closes_at is not None:
                wait_s = max(min(wait_s or math.inf, closes_at - loop.time()), 0.0)
            await _wait(woken, wait_s)


async def _wait(woken: asyncio.Event, seconds: float | None) -> None:
    """Until `woken` is set, or for `seconds` (None: no limit)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(woken.wait(), seconds)
