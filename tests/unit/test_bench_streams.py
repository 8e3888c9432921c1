"""The idle streams benchmark's page (bench/streams.py), written by its template from the measurements kept."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jinja2
import pytest

from bench import streams


def _result(cpu_share: float, transactions_per_s: float, memory_after_mib: float) -> dict[str, Any]:
    return {
        "opened": 2000,
        "still_open": 2000,
        "cpu_share": cpu_share,
        "transactions_per_s": transactions_per_s,
        "memory_before_mib": 109.0,
        "memory_after_mib": memory_after_mib,
    }


def _measured() -> dict[str, Any]:
    """One run's measurements, as the page of 2026-11-28 shows them."""
    return {
        "date": "2026-11-28",
        "streams": 2000,
        "pipelines": 100,
        "window_s": 30.0,
        "before_commit": "147662a1567ddbdf406ea0e0e794f366ccc7c036",
        "before": _result(0.776, 494.6, 223.0),
        "after": _result(0.029, 2.1, 215.0),
        "facts": {"date": "2026-11-28 00:53 UTC", "cores": 2, "packages": {"dramatiq": "2.2.1"}},
    }


def test_the_page_shows_both_codes_idle_streams_and_the_machine() -> None:
    page = streams.render(_measured())
    assert "{{" not in page and "{%" not in page
    assert "| before (`147662a`) | 2,000 | 2,000 | 77.6% | 494.6 | 109 MiB | 223 MiB | 58 KiB |" in page
    assert "| this tree | 2,000 | 2,000 | 2.9% | 2.1 | 109 MiB | 215 MiB | 54 KiB |" in page
    assert "on 2026-11-28: 2,000 event streams of 100 running pipelines" in page and "over 30 s once" in page
    assert "- cores: 2\n- packages: {'dramatiq': '2.2.1'}\n" in page


def test_the_page_is_written_again_from_the_kept_measurements(tmp_path: pathlib.Path) -> None:
    (tmp_path / "streams.json").write_text(json.dumps(_measured()))
    assert streams.main(["--render", "--output", str(tmp_path / "streams.md")]) == 0
    assert (tmp_path / "streams.md").read_text() == streams.render(_measured())


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = _measured()
    del measured["before"]["still_open"]
    with pytest.raises(jinja2.UndefinedError):
        streams.render(measured)
