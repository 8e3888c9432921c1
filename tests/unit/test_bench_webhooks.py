"""The webhooks benchmark's page (bench/webhooks.py), written by its template from the measurements kept beside it."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jinja2
import pytest

from bench import webhooks


def _measured() -> dict[str, Any]:
    """One run's measurements, as the page of 2026-11-28 shows them."""
    settings = {"webhook_concurrency": 100, "webhook_per_host": 50, "webhook_poll_s": 1.0, "webhook_timeout_s": 10.0}
    return {
        "date": "2026-11-28",
        "answer_s": 1.0,
        "before_commit": "147662a1567ddbdf406ea0e0e794f366ccc7c036",
        "notices": 1000,
        "target_s": 30.0,
        "before": {"notices": 30, "delivered": 30, "seconds": 30.76, "peak_at_once": 1},
        "after": {"notices": 1000, "delivered": 1000, "seconds": 21.76, "peak_at_once": 50, "settings": settings},
        "facts": {"date": "2026-11-28 00:56 UTC", "cores": 2, "postgres": {"version": "PostgreSQL 15.20"}},
    }


def test_the_page_shows_both_codes_the_projection_and_whether_the_target_was_met() -> None:
    page = webhooks.render(_measured())
    assert "{{" not in page and "{%" not in page
    assert (
        "| before (`147662a`) | 30 | 30 | 30.8 | 0.98 | 1 |\n| this tree | 1,000 | 1,000 | 21.8 | 45.96 | 50 |" in page
    )
    assert "at its measured rate, 1,000 would take about 1,025 s (projected, not measured)" in page
    assert "in 21.8 s against a target of 30 s: met. Its settings: `CASTAD_API_WEBHOOK_CONCURRENCY=100`," in page
    assert "- cores: 2\n- postgres: {'version': 'PostgreSQL 15.20'}\n" in page
    late = _measured()
    late["after"]["seconds"] = 31.0
    assert "against a target of 30 s: not met." in webhooks.render(late)


def test_the_page_is_written_again_from_the_kept_measurements(tmp_path: pathlib.Path) -> None:
    (tmp_path / "webhooks.json").write_text(json.dumps(_measured()))
    assert webhooks.main(["--render", "--output", str(tmp_path / "webhooks.md")]) == 0
    assert (tmp_path / "webhooks.md").read_text() == webhooks.render(_measured())


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = _measured()
    del measured["after"]["peak_at_once"]
    with pytest.raises(jinja2.UndefinedError):
        webhooks.render(measured)
