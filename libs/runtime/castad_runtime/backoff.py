"""Exponential backoff with jitter: pure arithmetic, and a small stateful helper for retry loops."""

from __future__ import annotations

import random
import threading


def exponential_s(tries: int, first_s: float, max_s: float, jitter: float, rng: random.Random) -> float:
    """The delay after `tries` failed tries before it.

    `first_s` doubled each time up to `max_s`, with up to `jitter` of it taken off at random.
    """
    return min(max_s, first_s * 2.0**tries) * (1 - jitter * rng.random())


class Backoff:
    """Delays that double from `first_s` up to `max_s`, each with up to `jitter` of it taken off at random."""

    def __init__(self, first_s: float = 0.1, max_s: float = 5.0, jitter: float = 0.3) -> None:
        if not 0 < first_s <= max_s or not 0 <= jitter < 1:
            raise ValueError("need 0 < first_s <= max_s and 0 <= jitter < 1")
        self.first_s = first_s
        self.max_s = max_s
        self.jitter = jitter
        self.tries = 0
        # Made at the first delay: seeding one from the OS costs more than a retry loop that never waits
        # (outages.keep_trying around every handler and outcome) spends otherwise.
        self._rng: random.Random | None = None

    def next_s(self) -> float:
        if self._rng is None:
            self._rng = random.Random()
        delay = exponential_s(self.tries, self.first_s, self.max_s, self.jitter, self._rng)
        self.tries += 1
        return delay

    def wait(self, stop: threading.Event | None = None) -> bool:
        """Sleep the next delay; True if `stop` was set meanwhile (or already)."""
        delay = self.next_s()
        if stop is None:
            threading.Event().wait(delay)
            return False
        return stop.wait(delay)
