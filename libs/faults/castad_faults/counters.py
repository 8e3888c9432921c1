"""Counters of every service process through a fault run, read from their /metrics once a second.

A process that is killed loses its counters; what it counted until its last scrape is kept, and a
process started again under the same name (`restarted`) counts from zero beside it. So the total of
a counter at any moment of the run is the sum, over every process that ever ran, of its last value
by then, give or take the second before a kill.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

DUPLICATES = "castad_inbox_duplicates_total"  # events an inbox saw again and dropped
COUNTERS = (DUPLICATES,)
INTERVAL_S = 1.0


class Counters:
    """Scrapes `endpoints()` (process name -> its /metrics URL, as the processes are now) every INTERVAL_S."""

    def __init__(self, endpoints: Callable[[], Mapping[str, str]]) -> None:
        self.endpoints = endpoints
        self._last: dict[tuple[str, int], dict[str, float]] = {}  # (process, incarnation) -> counter -> value
        self._incarnation: dict[str, int] = {}
        self._history: dict[str, list[tuple[float, float]]] = {name: [] for name in COUNTERS}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="counters", daemon=True)

    def start(self) -> Counters:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def restarted(self, process: str) -> None:
        """`process` was started again: its counters start from zero, its earlier ones are kept."""
        with self._lock:
            self._incarnation[process] = self._incarnation.get(process, 0) + 1

    def total(self, name: str, at: float) -> float:
        """The counter's total over every process at wall-clock time `at` (as of the last scrape before it)."""
        history = self._history[name]
        index = bisect.bisect_right(history, (at, float("inf")))
        return history[index - 1][1] if index else 0.0

    def between(self, name: str, start: float, end: float) -> float:
        return self.total(name, end) - self.total(name, start)

    def _run(self) -> None:
        with httpx.Client(timeout=2) as http:
            while not self._stop.wait(INTERVAL_S):
                for process, url in self.endpoints().items():
                    self._scrape(http, process, url)
                now = time.time()
                with self._lock:
                    for name in COUNTERS:
                        total = sum(values.get(name, 0.0) for values in self._last.values())
                        self._history[name].append((now, total))

    def _scrape(self, http: httpx.Client, process: str, url: str) -> None:
        try:
            text = http.get(url).text
        except httpx.HTTPError:
            return  # down, stopped or starting: its last values stand
        values = {
            name: sum(sample.value for sample in family.samples if sample.name == name)
            for family in text_string_to_metric_families(text)
            for name in COUNTERS
            if family.name == name.removesuffix("_total")
        }
        with self._lock:
            self._last[(process, self._incarnation.get(process, 0))] = values
