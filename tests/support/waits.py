"""The one way the tests wait: call a probe until it says yes, and fail saying what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def until(
    probe: Callable[[], T],
    *,
    what: str = "",
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    check: Callable[[], object] | None = None,
) -> T:
    """Call `probe` until it returns something truthy and return that; fail the test after `timeout_s`.

    `check` runs before each call and raises to stop waiting at once (a service that died, say).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:g} s: {what or probe}")
        time.sleep(interval_s)
