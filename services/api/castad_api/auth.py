"""Who calls, decided cheaply for those who fail.

The public port answers anyone, so a bogus key must not cost a database query each time, and a client that keeps
failing is slowed.

- A key not of the form keys.py makes (`cad_` and 40 URL-safe characters) is refused without a look-up.
- A well-formed key found unknown or revoked is remembered for UNKNOWN_TTL_S, so that sending it again
  costs no query (a key is random: nobody sends one before it is made, and a revoked key stays revoked).
- Every failure takes a token from its client's bucket (CASTAD_API_AUTH_FAILURE_BURST at once, then
  CASTAD_API_AUTH_FAILURES_PER_S a second); once it is empty, the client's failures are answered 429 with
  Retry-After instead of 401. A client is its address, or for IPv6 its /64 (one host holds a whole /64).
- Only failures are throttled, not keys: behind a load balancer, a NAT or a proxy not trusted for
  X-Forwarded-For (CASTAD_API_FORWARDED_ALLOW_IPS) one bad client shares its address with every tenant. A key
  found valid in the last VALID_TTL_S is looked up and served whatever its address did. A throttled client's
  other keys are looked up within a budget of their own (THROTTLED_LOOKUPS at once, then at the failures' rate),
  so that made-up keys cost a bounded number of queries; past it they get 429 unlooked-at, a valid key this
  process has not seen in that time among them (the one way a valid key meets the throttle: the memory is per
  process and starts empty, so right after a restart or a rollout every key is one it has not seen).

Each counted in castad_api_auth_failures_total by reason. All of it is held in process: each replica of
the gateway keeps its own buckets and memory, so across N replicas a client meets N times the limit.
"""

from __future__ import annotations

import collections
import enum
import ipaddress
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa

from castad_api import buckets, keys

UNKNOWN_TTL_S = 60.0
VALID_TTL_S = 3600.0  # a key found valid is looked up again each time, and never throttled within this
THROTTLED_LOOKUPS = 5  # keys not known valid that a throttled client may have looked up at once
MAX_REMEMBERED = buckets.MAX_REMEMBERED  # unknown keys: the oldest are forgotten beyond it


class Failure(enum.StrEnum):
    MISSING = "missing"  # no Authorization: Bearer header
    MALFORMED = "malformed"  # not a key this gateway could have made
    UNKNOWN = "unknown"  # unknown or revoked
    THROTTLED = "throttled"  # a failure of a client that failed too often: 429


class Refused(Exception):
    """The caller is not authenticated: `failure` says why; `retry_after_s` when it is throttled."""

    def __init__(self, failure: Failure, retry_after_s: float | None = None) -> None:
        super().__init__(failure.value)
        self.failure = failure
        self.retry_after_s = retry_after_s

    def retry_after(self) -> str:
        return buckets.retry_after(self.retry_after_s or 0)


def client_of(address: str) -> str:
    """Whose bucket an address's failures take from.

    The address, or for IPv6 its /64 (for an IPv4 address mapped into IPv6: the IPv4 address).
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # not an address (a test client's name, a Unix socket): itself
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class FailureLimit:
    """A token bucket per client (`client_of`), taken from by failures only: `burst` at once, `per_s` a second."""

    def __init__(self, burst: int, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s = per_s
        self.clock = clock
        self._buckets = buckets.Buckets(burst, per_s, clock)

    def wait_s(self, address: str) -> float | None:
        """How long `address` must wait before it may fail again unslowed; None: it may now."""
        return self._buckets.wait_s(client_of(address))

    def failed(self, address: str) -> float | None:
        """Count a failure of `address`: None if its bucket took it, else how long until it may fail unslowed."""
        return self._buckets.take(client_of(address))


class Remembered:
    """Digests of keys, each remembered for `ttl_s` (those found unknown or revoked; those found valid)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
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
        self.unknown = Remembered(UNKNOWN_TTL_S)
        self.valid = Remembered(VALID_TTL_S)
        # What a throttled client's new keys may cost: a look-up each, THROTTLED_LOOKUPS at once, then one a while.
        self.lookups = buckets.Buckets(THROTTLED_LOOKUPS, limit.per_s, limit.clock)
        self.on_failure = on_failure

    def authenticate(self, engine: sa.Engine, token: str | None, address: str) -> keys.Principal:
        if token is None:
            raise self._failed(Failure.MISSING, address)
        if not keys.well_formed(token):
            raise self._failed(Failure.MALFORMED, address)
        digest = keys.digest(token)
        if digest in self.unknown:
            raise self._failed(Failure.UNKNOWN, address)
        if digest not in self.valid and (wait_s := self._throttled_lookup(address)) is not None:
            self.on_failure(Failure.THROTTLED)
            raise Refused(Failure.THROTTLED, wait_s)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # no BEGIN, no ROLLBACK
            principal = keys.authenticate(conn, token)
        if principal is None:
            self.unknown.add(digest)
            raise self._failed(Failure.UNKNOWN, address)
        self.valid.add(digest)
        return principal

    def _throttled_lookup(self, address: str) -> float | None:
        """None if a key not known valid may be looked up for `address`; else how long until one may.

        A client that has not used up its failures may; a throttled one within its budget of look-ups."""
        if self.limit.wait_s(address) is None:
            return None
        return self.lookups.take(client_of(address))

    def _failed(self, failure: Failure, address: str) -> Refused:
        """A failure, counted; answered 429 once its client used up its bucket."""
        wait_s = self.limit.failed(address)
        if wait_s is not None:
            self.on_failure(Failure.THROTTLED)
            return Refused(Failure.THROTTLED, wait_s)
        self.on_failure(failure)
        return Refused(failure)
