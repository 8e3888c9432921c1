"""The wake-up benchmark's page (bench/wakeups.py), written by its template from the measurements kept beside it."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jinja2
import pytest

from bench import wakeups


def _measured() -> dict[str, Any]:
    """One run's measurements, those of the page of 2026-11-28."""
    rates = {"none": 1597.0, "after_commit": 890.0, "in_transaction": 1906.0, "waker": 1486.0}
    return {
        "facts": {"date": "2026-11-28 01:30 UTC", "cores": 2, "cpu": "test", "postgres": "15", "load": "0 / 0 / 0"},
        "writers": 32,
        "per_writer": 150,
        "rounds": 3,
        "probes": 200,
        "probe_gap_s": 0.01,
        "target": 0.10,
        "rates": {
            variant: {"rate": rate, "round_rates": [rate - 10, rate, rate + 10]} for variant, rate in rates.items()
        },
        "heard": {"after_commit": {"p50": 0.03, "p99": 0.08}, "waker": {"p50": 0.39, "p99": 0.71}},
    }


def test_the_page_shows_each_variant_beside_no_wake_up_and_whether_the_waker_met_its_target() -> None:
    page = wakeups.render(_measured())
    assert "{{" not in page and "{%" not in page
    assert "| no wake-up | 1,597 | 100% | 1,587, 1,597, 1,607 | - |" in page
    assert "| the waker, after the commit (now) | 1,486 | 93% | 1,476, 1,486, 1,496 | 0.39 / 0.71 |" in page
    assert "| NOTIFY inside the transaction (the trigger before) | 1,906 | 119% | 1,896, 1,906, 1,916 | - |" in page
    assert "32 writer threads, each committing 150 transactions" in page and "200 single commits\n10 ms apart" in page
    assert "Target: the waker within 10% of no wake-up at all: met." in page
    slower = _measured()
    slower["rates"]["waker"]["rate"] = 1400.0
    assert "Target: the waker within 10% of no wake-up at all: not met." in wakeups.render(slower)


def test_the_page_is_written_again_from_the_kept_measurements(tmp_path: pathlib.Path) -> None:
    (tmp_path / "wakeups.json").write_text(json.dumps(_measured()))
    assert wakeups.main(["--render", "--output", str(tmp_path / "wakeups.md")]) == 0
    assert (tmp_path / "wakeups.md").read_text() == wakeups.render(_measured())


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = _measured()
    del measured["probes"]
    with pytest.raises(jinja2.UndefinedError):
        wakeups.render(measured)
