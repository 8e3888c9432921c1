"""The song benchmark's page (bench/song.py), written by its template from the measurements kept beside it."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jinja2
import pytest

from bench import song


def _measured() -> dict[str, Any]:
    """One run's measurements, those of the page of 2026-11-27 for Korean and Japanese."""
    cpu_s = {("Korean", "female"): 0.45, ("Korean", "none"): 0.02, ("Japanese", "male"): 0.96}
    return {
        "facts": {"date": "2026-11-27 22:12 UTC", "cores": 2, "cpu": "test", "python": "3.11.7"},
        "duration_s": 30,
        "rounds": 3,
        "budgets": {"sung_s": 1.0, "instrumental_s": 0.33},
        "songs": [{"language": language, "voice": voice, "cpu_s": s} for (language, voice), s in cpu_s.items()],
    }


def test_the_page_shows_each_song_beside_its_budget() -> None:
    page = song.render(_measured())
    assert "{{" not in page and "{%" not in page
    assert "| Korean | female | 0.45 | 1.00 | met |\n| Korean | none | 0.02 | 0.33 | met |" in page
    assert "| Japanese | male | 0.96 | 1.00 | met |" in page
    assert "composing a 30 s song" in page and "the median of 3 rounds" in page
    assert "Run 2026-11-27 22:12 UTC on 2 cores, test; Python 3.11.7." in page
    over = _measured()
    over["songs"][1]["cpu_s"] = 0.4
    assert "| Korean | none | 0.40 | 0.33 | not met |" in song.render(over)


def test_the_page_is_written_again_from_the_kept_measurements(tmp_path: pathlib.Path) -> None:
    (tmp_path / "song.json").write_text(json.dumps(_measured()))
    assert song.main(["--render", "--output", str(tmp_path / "song.md")]) == 0
    assert (tmp_path / "song.md").read_text() == song.render(_measured())


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = _measured()
    del measured["facts"]["python"]
    with pytest.raises(jinja2.UndefinedError):
        song.render(measured)
