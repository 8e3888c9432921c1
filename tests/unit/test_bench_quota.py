"""The quota benchmark's page (bench/quota.py), written by its template from the measurements kept beside it."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jinja2
import pytest

from bench import quota


def _round(rate: float, p50: float, p99: float, missed: int = 0) -> dict[str, Any]:
    return {"rate": rate, "latency_ms": {"p50": p50, "p99": p99}, "missed": missed}


def _measured() -> dict[str, Any]:
    """One run's measurements, as the page of 2026-11-28 shows them (each round at the latency's medians)."""
    return {
        "facts": {"date": "2026-11-28 04:52 UTC", "cores": 2, "cpu": "test", "postgres": "15", "load": "0 / 0 / 0"},
        "claimers": 32,
        "per_claimer": 20,
        "round_count": 3,
        "in_flight": 10_000,
        "cap": 1_000_000,
        "rounds": {
            "one_row": [_round(153.6, 146.1, 742.2, 3), _round(163.0, 146.1, 742.2), _round(144.0, 146.1, 742.2)],
            "sharded": [_round(339.0, 59.2, 319.2), _round(399.0, 59.2, 319.2), _round(361.4, 59.2, 319.2)],
        },
    }


def test_the_page_shows_each_variants_median_round_beside_before() -> None:
    page = quota.render(_measured())
    assert "{{" not in page and "{%" not in page
    assert (
        "| one locked row, count(*) under its lock (before) | 154 | 1.00x | 154, 163, 144 | 146.1 / 742.2 | 3 |" in page
    )
    now = "| shards taken with SKIP LOCKED, a counted in-flight total (now) | 361 | 2.35x | 339, 399, 361 |"
    assert f"{now} 59.2 / 319.2 | 0 |" in page
    assert "32 claimer threads" in page and "10,000 jobs in flight" in page and "of 1,000,000" in page
    assert "over 3 rounds" in page


def test_the_page_is_written_again_from_the_kept_measurements(tmp_path: pathlib.Path) -> None:
    (tmp_path / "quota.json").write_text(json.dumps(_measured()))
    assert quota.main(["--render", "--output", str(tmp_path / "quota.md")]) == 0
    assert (tmp_path / "quota.md").read_text() == quota.render(_measured())


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = _measured()
    del measured["cap"]
    with pytest.raises(jinja2.UndefinedError):
        quota.render(measured)
