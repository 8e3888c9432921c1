"""Transactions committed per database, from PostgreSQL's statistics (`pg_stat_database.xact_commit`).

A PostgreSQL 15 backend reports its counts when it has been idle for a while (within 10 s), so a
reading is taken after `FLUSH_S` of waiting. What the services commit with no work (their pollers)
is measured over as long and taken off, so that the count is the work's own.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import psycopg
from castad_testkit import scratch

FLUSH_S = 11.0


def read(databases: Iterable[str], settle: bool = True) -> dict[str, int]:
    names = list(databases)
    if settle:
        time.sleep(FLUSH_S)
    with psycopg.connect(scratch.admin_dsn(), autocommit=True) as conn:
        rows: dict[str, int] = dict(
            conn.execute("SELECT datname, xact_commit FROM pg_stat_database WHERE datname = ANY(%s)", (names,))
        )
    return {name: int(rows.get(name, 0)) for name in names}


def idle_rate(databases: Iterable[str], seconds: float = FLUSH_S) -> dict[str, float]:
    """Commits per second of each database while nothing is asked of its service."""
    names = list(databases)
    before = read(names)
    time.sleep(seconds)
    after = read(names)
    return {name: (after[name] - before[name]) / (seconds + FLUSH_S) for name in names}


class Counter:
    """Commits of a measured piece of work: `start()` before it, `stop(units)` after (per unit)."""

    def __init__(self, databases: Iterable[str]) -> None:
        self.databases = list(databases)
        self.idle: dict[str, float] = {}
        self._before: dict[str, int] = {}
        self._started = 0.0

    def start(self) -> None:
        self.idle = idle_rate(self.databases)
        self._before = read(self.databases)
        self._started = time.monotonic()

    def stop(self, units: int) -> dict[str, float]:
        after = read(self.databases)
        elapsed = time.monotonic() - self._started
        return {name: (after[name] - self._before[name] - self.idle[name] * elapsed) / units for name in self.databases}
