"""CPU time spent by the processes of a measurement, from /proc (Linux only)."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Iterable

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
Snapshot = dict[int, float]


def _stat(pid: int) -> tuple[int, float] | None:
    """(process group, CPU seconds of the process and its reaped children)."""
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): pgrp is field 5, utime..cstime are fields 14..17.
    ticks = sum(int(value) for value in fields[11:15])
    return int(fields[2]), ticks * TICK_S


def _cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _pids() -> Iterable[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            yield int(entry.name)


def snapshot(select: Callable[[int, int, str], bool]) -> Snapshot:
    """CPU seconds of every process for which select(pid, pgrp, cmdline) holds."""
    result = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None and select(pid, stat[0], _cmdline(pid)):
            result[pid] = stat[1]
    return result


def used(before: Snapshot, after: Snapshot) -> float:
    """CPU seconds used between two snapshots (processes that ended in between are not counted)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def in_group(pgid: int) -> Callable[[int, int, str], bool]:
    return lambda pid, pgrp, cmdline: pgrp == pgid


def postgres_backends(*databases: str) -> Callable[[int, int, str], bool]:
    """Server processes of connections to these databases.

    Their title is `postgres: <cluster>: <user> <database> <client> <state>`, padded with spaces.
    """
    names = {f" {database} " for database in databases}
    return lambda pid, pgrp, cmdline: cmdline.startswith("postgres: ") and any(name in cmdline for name in names)


def rabbitmq() -> Callable[[int, int, str], bool]:
    return lambda pid, pgrp, cmdline: "beam.smp" in cmdline and "rabbit" in cmdline
