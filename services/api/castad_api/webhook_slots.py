"""The places of the notices a gateway process has in flight: so many at once, and so many per receiving host.

A receiver answering slowly holds its places for as long as it takes, never another host's: a tenant whose
receiver answers in 10 s delays its own notices, not everyone's. A notice's host is read once, when it is
made (`host`, kept in `webhook_deliveries.host`), by the URL parser the sender connects with, so that every
spelling of one host shares its places and the claim can pass over the notices of hosts with no place left
without taking them.
"""

from __future__ import annotations

import collections
import ipaddress
import threading

import httpx

DEFAULT_PORTS = {"http": 80, "https": 443}


def host(url: str) -> str:
    """The receiving host of `url` as `host:port`, one spelling for all of its own.

    The host in lower case, IDNA-encoded, without a trailing dot, an IPv6 address compressed within brackets;
    the port written out, the scheme's own when the URL has none; userinfo, path, query and fragment left out.
    "" for a URL without a host (all such share one place).
    """
    try:
        parsed = httpx.URL(url)
        name = parsed.raw_host.decode("ascii").lower().rstrip(".")
    except (httpx.InvalidURL, UnicodeError):
        return ""
    if not name:
        return ""
    port = parsed.port or DEFAULT_PORTS.get(parsed.scheme)
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        name = f"[{address.compressed}]" if address.version == 6 else address.compressed
    return f"{name}:{port}" if port is not None else name


class Slots:
    """At most `total` notices in flight, at most `per_host` of them to one host.

    Taken and given back from any thread.
    """

    def __init__(self, total: int, per_host: int) -> None:
        self.total = total
        self.per_host = min(per_host, total)
        self._held: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def free(self) -> int:
        """How many more notices may be in flight now."""
        with self._lock:
            return self.total - self._held.total()

    def in_flight(self) -> int:
        with self._lock:
            return self._held.total()

    def full_hosts(self) -> list[str]:
        """The hosts with no place left."""
        with self._lock:
            return [name for name, held in self._held.items() if held >= self.per_host]

    def take(self, name: str) -> bool:
        """A place for one more notice to host `name`, if there is one."""
        with self._lock:
            if self._held.total() >= self.total or self._held[name] >= self.per_host:
                return False
            self._held[name] += 1
            return True

    def give_back(self, name: str) -> None:
        with self._lock:
            self._held[name] -= 1
            if self._held[name] <= 0:
                del self._held[name]
