"""The clock a lease is judged by in this process: it never goes back, and it counts a suspended machine's sleep.

A lease held from a database is known held until some moment of this clock; a process frozen past it (stopped,
paused, swapped out, its machine suspended) must find, when it wakes, that the moment passed. CLOCK_BOOTTIME
(Linux) does; `time.monotonic` stops while the machine sleeps, so a woken process would think it still held
what another had taken over. Elsewhere, `time.monotonic` it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


def now() -> float:
    """Seconds on the lease clock (see the module docstring)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()
