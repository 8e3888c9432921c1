"""Token buckets held in process, one per key, the least recently used forgotten beyond MAX_REMEMBERED.

Each replica of the gateway keeps its own: across N replicas a caller meets N times the limit.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Hashable

MAX_REMEMBERED = 10_000


def retry_after(wait_s: float) -> str:
    """A Retry-After header's value for a wait: whole seconds, at least one."""
    return str(max(1, math.ceil(wait_s)))


@dataclasses.dataclass
class _Bucket:
    tokens: float
    at: float


class Buckets:
    """A token bucket per key: `burst` tokens at once, `per_s` more a second."""

    def __init__(self, burst: int, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.per_s = per_s
        self.clock = clock
        self._buckets: collections.OrderedDict[Hashable, _Bucket] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _refilled(self, key: Hashable, now: float) -> _Bucket | None:
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.per_s)
            bucket.at = now
        return bucket

    def wait_s(self, key: Hashable) -> float | None:
        """How long until `key` has a token; None: it has one now."""
        with self._lock:
            now = self.clock()
            bucket = self._refilled(key, now)
            if bucket is None or bucket.tokens >= 1:
                return None
            return (1 - bucket.tokens) / self.per_s

    def take(self, key: Hashable) -> float | None:
        """Take a token of `key`'s if it has one (None); else how long until it has one, nothing taken."""
        with self._lock:
            now = self.clock()
            bucket = self._refilled(key, now) or _Bucket(float(self.burst), now)
            self._buckets[key] = bucket
            self._buckets.move_to_end(key)
            while len(self._buckets) > MAX_REMEMBERED:
                self._buckets.popitem(last=False)
            if bucket.tokens < 1:
                return (1 - bucket.tokens) / self.per_s
            bucket.tokens -= 1
            return None
