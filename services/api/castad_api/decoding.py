"""The uploads a gateway process decodes: one at a time, a few more waiting their turn, the rest refused.

Cleaning an image holds about twice its decoded pixels (castad_runtime.images): some 320 MB at the default
CASTAD_API_IMAGE_MAX_PIXELS of 40 million. The API's pod may use 768Mi and one CPU (infra/helm/api):
a second decode at once would not finish sooner on one CPU and would take the process past its limit,
so a process decodes one upload at a time. The others wait on an anyio CapacityLimiter, holding no
worker thread: FastAPI runs every plain route on the same pool of threads, which a lock taken on one of
them would use up. An upload waiting holds its body (up to CASTAD_API_IMAGE_MAX_BYTES), so at most
WAITING wait, counting those still reading theirs; the next is refused at once (503 with Retry-After)
before its body is read.

In process, as auth.py: across N replicas N decode at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")
AT_ONCE = 1
WAITING = 4  # their bodies, 40 MiB at the default CASTAD_API_IMAGE_MAX_BYTES, beside the one decoded
RETRY_AFTER_S = 5  # what an upload refused is told to wait: a few decodes of the largest images


class Busy(Exception):
    """As many uploads as may wait for their decode are waiting already."""


class Decoding:
    """The decodes of one gateway process, on its event loop."""

    def __init__(self, at_once: int = AT_ONCE, waiting: int = WAITING) -> None:
        self._turns = anyio.CapacityLimiter(at_once)
        self._most = at_once + waiting
        self._admitted = 0  # read and written on the event loop only: no lock

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """A place for one upload while its body is read and decoded; raises Busy if none is left."""
        if self._admitted >= self._most:
            raise Busy
        self._admitted += 1
        try:
            yield
        finally:
            self._admitted -= 1

    async def run(self, decode: Callable[[], T]) -> T:
        """`decode()` on a worker thread once it is its turn, waiting for that without one."""
        return await anyio.to_thread.run_sync(decode, limiter=self._turns)
