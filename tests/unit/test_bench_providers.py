"""The network providers benchmark's page (bench/providers.py), written by its template from the measurements."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jinja2
import pytest

from bench import providers

SUCCEEDED = {"jobs": {"SUCCEEDED": 200}, "attempts": {"succeeded": 200}, "completed_events": 200}


def _measured() -> dict[str, Any]:
    """One run's measurements, as the page of 2026-11-23 shows them."""
    return {
        "when": "2026-11-23T23:37:48+00:00",
        "args": {"pipelines": 200, "concurrency": 8, "song_s": 30.0, "render_s": 5.0},
        "throughput": {
            "seconds": 108.5,
            "rate": 1.84,
            "latency_ms": {"p50": 74_000.0, "p99": 100_000.0},
            "cpu_ms_per_pipeline": {"song": 241.0, "api": 167.0, "client": 133.0},
        },
        "peaks": {
            "threads": {"relay": 2, "api": 21},
            "sockets": {"relay": 11, "api": 40},
            "connections": {"song": 8, "api": 16},
            "awaiting": {"song": 170, "video": 57},
            "running": {"song": 2},
        },
        "provider_requests": {"chat": {"POST /v1/chat/completions": 200}},
        "callbacks": {"creatomate": {"succeeded → 204": 200}},
        "outcomes": {"lyric": SUCCEEDED},
        "findings": [],
    }


def test_the_page_shows_the_run_its_peaks_and_what_the_providers_and_stages_saw() -> None:
    page = providers.render(_measured())
    assert "{{" not in page and "{%" not in page
    assert "the music API takes 30 s per song, the render API 5 s per video" in page
    assert "- **All done in 108.5 s** (1.84 pipelines/s); latency per pipeline p50 74.0 s, p99 100.0 s." in page
    assert "- **Findings:** none." in page
    assert "| api | 21 | 40 |\n| relay | 2 | 11 |" in page and "| api | 16 |\n| song | 8 |" in page
    assert "| song | 170 | 2 |\n| video | 57 | 0 |" in page
    assert "- chat: {'POST /v1/chat/completions': 200}\n- callbacks of creatomate: {'succeeded → 204': 200}" in page
    assert f"- lyric: {SUCCEEDED}" in page
    assert page.endswith("CPU per pipeline (ms, by process): api 167, client 133, song 241\n")
    failed = _measured()
    failed["findings"] = ["song: 1 attempts failed", "video: jobs {}"]
    assert "- **Findings:** song: 1 attempts failed; video: jobs {}." in providers.render(failed)


def test_the_page_is_written_again_from_the_kept_measurements_and_a_finding_fails_the_run(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "providers.json").write_text(json.dumps(_measured()))
    assert providers.main(["--render", "--output", str(tmp_path / "providers.md")]) == 0
    assert (tmp_path / "providers.md").read_text() == providers.render(_measured())
    (tmp_path / "providers.json").write_text(json.dumps(_measured() | {"findings": ["song: 1 attempts failed"]}))
    assert providers.main(["--render", "--output", str(tmp_path / "providers.md")]) == 1


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = _measured()
    del measured["peaks"]["sockets"]["relay"]
    with pytest.raises(jinja2.UndefinedError):
        providers.render(measured)
