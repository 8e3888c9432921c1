"""The pure parts of the operator's statistics: the window, the buckets of the throughput, rates."""

from __future__ import annotations

import pytest
from castad_api import errors, stats


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15m", 900),
        ("1h", 3600),
        ("24h", 86_400),
        ("7d", 604_800),
        ("900", 900),
        ("900s", 900),
        (" 2h ", 7200),
        ("60", 60),
    ],
)
def test_a_window_is_minutes_hours_days_or_seconds(text, seconds):
    assert stats.parse_window(text) == seconds


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("59", "from 60 s to 7 days"),
        ("8d", "from 60 s to 7 days"),
        ("169h", "from 60 s to 7 days"),
        ("0m", "from 60 s to 7 days"),
        ("1w", "a number of seconds"),
        ("1.5h", "a number of seconds"),
        ("-1h", "a number of seconds"),
        ("h", "a number of seconds"),
        ("", "a number of seconds"),
        ("1h30m", "a number of seconds"),
        ("9" * 12, "a number of seconds"),
        ("²", "a number of seconds"),
    ],
)
def test_any_other_window_is_refused_with_the_reason(text, says):
    with pytest.raises(errors.BadWindow, match=says):
        stats.parse_window(text)


@pytest.mark.parametrize(
    ("window_s", "bucket_s", "buckets"),
    [(60, 60, 1), (900, 60, 15), (3600, 60, 60), (4 * 3600, 60, 240), (86_400, 360, 240), (604_800, 2520, 240)],
)
def test_the_throughput_has_whole_minute_buckets_and_at_most_240_of_them(window_s, bucket_s, buckets):
    assert stats.bucket_seconds(window_s) == bucket_s
    assert -(-window_s // bucket_s) == buckets  # ceil: a window not a whole number of buckets ends in a short one


def test_a_rate_is_none_without_a_whole_and_per_minute_spreads_over_the_window():
    assert stats.rate(1, 3) == pytest.approx(1 / 3)
    assert stats.rate(0, 4) == 0.0
    assert stats.rate(0, 0) is None
    assert stats.per_minute(30, 3600) == 0.5
    assert stats.per_minute(7, 60) == 7.0
