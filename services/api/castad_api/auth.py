"""Who calls, decided cheaply for those who fail.

The public port answers anyone, so a bogus key must not cost a database query each time, and a client address that
keeps failing is slowed.

- A key not of the form keys.py makes (`cad_` and 40 URL-safe characters) is refused without a look-up.
- A well-formed key found unknown or revoked is remembered for UNKNOWN_TTL_S, so that sending it again
  costs no query (a key is random: nobody sends one before it is made, and a revoked key stays revoked).
- Every failure takes a token from its client address's bucket (CASTAD_API_AUTH_FAILURE_BURST at once,
  then CASTAD_API_AUTH_FAILURES_PER_S a second); an address whose bucket is empty gets 429 with Retry-After
  before anything is looked at, whatever key it sends. Behind a proxy, the client address is the one its
  X-Forwarded-For names only for proxies in CASTAD_API_FORWARDED_ALLOW_IPS; otherwise every client behind
  it shares the proxy's bucket.

Each counted in castad_api_auth_failures_total by reason. All of it is held in process: each replica of
the gateway keeps its own buckets and memory, so across N replicas a client meets N times the limit.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa

from castad_api import keys

UNKNOWN_TTL_S = 60.0
MAX_REMEMBERED = 10_000  # addresses with a bucket, unknown keys: the oldest are forgotten beyond it


class Failure(enum.StrEnum):
    MISSING = "missing"  # no Authorization: Bearer header
    MALFORMED = "malformed"  # not a key this gateway could have made
    UNKNOWN = "unknown"  # unknown or revoked
    THROTTLED = "throttled"  # not looked at: the address failed too often


class Refused(Exception):
    """The caller is not authenticated: `failure` says why; `retry_after_s` when it is throttled."""

    def __init__(self, failure: Failure, retry_after_s: float | None = None) -> None:
        super().__init__(failure.value)
        self.failure = failure
        self.retry_after_s = retry_after_s

    def retry_after(self) -> str:
        return str(max(1, math.ceil(self.retry_after_s or 0)))


@dataclasses.dataclass
class _Bucket:
    tokens: float
    at: float


class FailureLimit:
    """A token bucket per client address, taken from by failures only: `burst` at once, `per_s` a second."""

    def __init__(self, burst: int, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.per_s = per_s
        self.clock = clock
        self._buckets: collections.OrderedDict[str, _Bucket] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _refilled(self, address: str, now: float) -> _Bucket | None:
        bucket = self._buckets.get(address)
        if bucket is not None:
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.per_s)
            bucket.at = now
        return bucket

    def wait_s(self, address: str) -> float | None:
        """How long `address` must wait before it may try again; None: it may try now."""
        with self._lock:
            now = self.clock()
            bucket = self._refilled(address, now)
            if bucket is None or bucket.tokens >= 1:
                return None
            return (1 - bucket.tokens) / self.per_s

    def failed(self, address: str) -> None:
        with self._lock:
            now = self.clock()
            bucket = self._refilled(address, now) or _Bucket(float(self.burst), now)
            bucket.tokens = max(bucket.tokens - 1, 0.0)
            self._buckets[address] = bucket
            self._buckets.move_to_end(address)
            while len(self._buckets) > MAX_REMEMBERED:
                self._buckets.popitem(last=False)


class UnknownKeys:
    """Digests of keys found unknown or revoked, remembered for `ttl_s`."""

    def __init__(self, ttl_s: float = UNKNOWN_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._until: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, digest: str) -> bool:
        with self._lock:
            until = self._until.get(digest)
            if until is None:
                return False
            if until < self.clock():
                del self._until[digest]
                return False
            return True

    def add(self, digest: str) -> None:
        with self._lock:
            self._until[digest] = self.clock() + self.ttl_s
            self._until.move_to_end(digest)
            while len(self._until) > MAX_REMEMBERED:
                self._until.popitem(last=False)


class Authenticator:
    """Turns a bearer token from a client address into the caller it stands for, or Refused."""

    def __init__(self, limit: FailureLimit, on_failure: Callable[[Failure], None]) -> None:
        self.limit = limit
        self.unknown = UnknownKeys()
        self.on_failure = on_failure

    def authenticate(self, engine: sa.Engine, token: str | None, address: str) -> keys.Principal:
        wait_s = self.limit.wait_s(address)
        if wait_s is not None:
            self.on_failure(Failure.THROTTLED)
            raise Refused(Failure.THROTTLED, wait_s)
        if token is None:
            raise self._failed(Failure.MISSING, address)
        if not keys.well_formed(token):
            raise self._failed(Failure.MALFORMED, address)
        digest = keys.digest(token)
        if digest in self.unknown:
            raise self._failed(Failure.UNKNOWN, address)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # no BEGIN, no ROLLBACK
            principal = keys.authenticate(conn, token)
        if principal is None:
            self.unknown.add(digest)
            raise self._failed(Failure.UNKNOWN, address)
        return principal

    def _failed(self, failure: Failure, address: str) -> Refused:
        self.limit.failed(address)
        self.on_failure(failure)
        return Refused(failure)
