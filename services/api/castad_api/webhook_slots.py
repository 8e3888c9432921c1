"""The places of the notices a gateway process has in flight: so many at once, and so many per receiving host.

A receiver answering slowly holds its places for as long as it takes, never another host's: a tenant whose
receiver answers in 10 s delays its own notices, not everyone's. The host is read from the URL by one
pattern, in Python and in SQL alike (`HOST_PATTERN`), so the claim can pass over the notices of hosts with no
place left without taking them.
"""

from __future__ import annotations

import collections
import re
import threading

# The URL's host: after the scheme, before the port or the path; an IPv6 address with its brackets. The
# same text in PostgreSQL's regular expressions (substring ... from) as in Python's.
HOST_PATTERN = r"^[A-Za-z][A-Za-z0-9+.-]*://(\[[^]]*\]|[^/:?#]+)"
_HOST = re.compile(HOST_PATTERN)


def host(url: str) -> str:
    """The receiving host of `url`, in lower case ("" for a URL without one, all such sharing one place)."""
    match = _HOST.match(url)
    return match.group(1).lower() if match else ""


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
