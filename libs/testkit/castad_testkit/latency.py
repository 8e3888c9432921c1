"""Percentiles and one-line summaries of latency samples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TypedDict


class Summary(TypedDict):
    n: int
    p50: float
    p90: float
    p99: float
    mean: float
    min: float
    max: float


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between the two closest ranks (like numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float]) -> Summary:
    if not values:
        nan = math.nan
        return Summary(n=0, p50=nan, p90=nan, p99=nan, mean=nan, min=nan, max=nan)
    return Summary(
        n=len(values),
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
        mean=statistics.fmean(values),
        min=min(values),
        max=max(values),
    )


def ms(seconds: Sequence[float]) -> list[float]:
    return [value * 1000 for value in seconds]
