"""The statistics benchmark's page (bench/stats.py), written by its template from the measurements kept."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jinja2
import pytest

from bench import stats

WINDOWS = ["15m", "1h", "24h", "7d"]


def _measured() -> dict[str, Any]:
    """A run's measurements, shaped as bench.stats keeps them (JSON: tuples as lists)."""
    return {
        "facts": {
            "date": "2026-11-24 14:25 UTC",
            "cores": 2,
            "cpu": "test",
            "memory": "8 GiB",
            "postgres": {"version": "PostgreSQL 15.20", "shared_buffers": "128MB"},
        },
        "pipelines": 1_000_000,
        "dead_letters": 10_000,
        "repeat": 5,
        "windows": WINDOWS,
        "recent": 2000,
        "loaded": {"pipelines": 24.4, "vacuum analyze": 2.0},
        "tables": [["pipelines", 1_000_000, "355 MB", "315 MB"]],
        "timings": {"in_flight": dict(zip(WINDOWS, [0.3, 0.3, 0.4, 0.44], strict=True))},
        "whole": dict(zip(WINDOWS, [23.9, 34.3, 230.8, 1632.3], strict=True)),
        "searches": [["a word: 'cafe'", "t0", 100_000, 1.6]],
        "plans": {"in_flight": "Index Scan\nPlanning Time: 0.1 ms", "created, window 1h": "Seq Scan"},
        "search_plans": {"a word: 'cafe', t0": "Limit"},
    }


def test_the_page_shows_the_load_each_statement_by_window_the_searches_and_the_plans() -> None:
    page = stats.render(_measured())
    assert "{{" not in page and "{%" not in page
    assert "1,000,000 pipelines created over 30 days (~1,389 an hour)" in page
    assert "`VACUUM (ANALYZE)`: pipelines 24 s, vacuum analyze 2 s." in page
    assert "| pipelines | 1,000,000 | 355 MB | 315 MB |" in page
    assert (
        "| statement | 15m | 1h | 24h | 7d |\n|---|---:|---:|---:|---:|\n| `in_flight` | 0.3 | 0.3 | 0.4 | 0.4 |"
        in page
    )
    assert "| **`stats.read`, all of them in one transaction** | **23.9** | **34.3** | **230.8** | **1632.3** |" in page
    assert "the newest 2,000 pipelines" in page and "| a word: 'cafe' | t0 | 100,000 | 1.6 |" in page
    plans = (
        "### in_flight\n\n```\nIndex Scan\nPlanning Time: 0.1 ms\n```\n\n### created, window 1h\n\n```\nSeq Scan\n```\n"
    )
    assert f"## Plans\n\n{plans}\n### search: a word: 'cafe', t0\n\n```\nLimit\n```\n" in page
    assert page.endswith("```\nLimit\n```\n")


def test_the_page_is_written_again_from_the_kept_measurements(tmp_path: pathlib.Path) -> None:
    (tmp_path / "stats.json").write_text(json.dumps(_measured()))
    assert stats.main(["--render", "--output", str(tmp_path / "stats.md")]) == 0
    assert (tmp_path / "stats.md").read_text() == stats.render(_measured())


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = _measured()
    del measured["whole"]["7d"]
    with pytest.raises(jinja2.UndefinedError):
        stats.render(measured)
