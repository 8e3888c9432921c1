"""The fairness benchmark (bench/fairness.py): its waits' arithmetic, and the page written again from the
measurements kept beside it."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jinja2
import pytest

from bench import fairness


def _measured() -> dict[str, Any]:
    def tenants(b_waits: list[int], c_wait: int, last: dict[str, int]) -> dict[str, Any]:
        return {
            "A": {"waits": [1, 2, 3, 4, 31], "last_done": last["A"]},
            "B": {"waits": b_waits, "last_done": last["B"]},
            "C": {"waits": [c_wait], "last_done": last["C"]},
        }

    cost = {"p50": 2.0, "p95": 4.0}
    return {
        "facts": {"date": "2026-12-07 08:00 UTC", "cores": 2, "cpu": "test", "postgres": "15", "load": "0 / 0 / 0"},
        "slots": 4,
        "work_turns": 30,
        "turn_s": 0.5,
        "backlog": {
            "jobs": 5,
            "arrive_turn": 20,
            "late": {"B": 3, "C": 1},
            "runs": {
                "oldest": {"turns": 90, "tenants": tenants([40, 41, 42], 43, {"A": 61, "B": 73, "C": 74})},
                "fair": {"turns": 90, "tenants": tenants([11, 14, 42], 12, {"A": 90, "B": 72, "C": 62})},
            },
        },
        "weights": {
            "weights": {"A": 1, "D": 3},
            "jobs": 50,
            "first": 40,
            "runs": {"oldest": {"A": 40, "D": 0}, "fair": {"A": 10, "D": 30}},
        },
        "claim_cost": {
            "rounds": 3,
            "shapes": [
                {
                    "tenants": 10,
                    "each": 1_000,
                    "claims": 200,
                    "rounds": {
                        "oldest": [cost, cost, cost],
                        "fair": [{"p50": 3.0, "p95": 5.0}, cost, {"p50": 2.5, "p95": 6.0}],
                    },
                }
            ],
        },
    }


def test_a_tenants_waits_are_summed_up_by_their_median_95th_percentile_and_longest() -> None:
    assert fairness.summary([11, 14, 42]) == pytest.approx({"p50": 14, "p95": 39.2, "max": 42})
    assert fairness.summary([12]) == {"p50": 12, "p95": 12, "max": 12}


def test_each_tenants_share_is_its_part_of_the_songs_counted() -> None:
    assert fairness.shares({"A": 10, "D": 30}) == {"A": 0.25, "D": 0.75}


def test_the_page_lists_the_claims_shapes_as_prose_lists_numbers() -> None:
    measured = _measured()
    assert "10,000 jobs due, of 10 tenants (their tenants" in fairness.render(measured)
    [shape] = measured["claim_cost"]["shapes"]
    measured["claim_cost"]["shapes"] += [dict(shape, tenants=100, each=100), dict(shape, tenants=1_000, each=10)]
    assert "10,000 jobs due, of 10, 100 or 1,000 tenants (their tenants" in fairness.render(measured)


def test_the_template_writes_every_figure_of_the_sample_and_names_none_it_was_not_given() -> None:
    page = fairness.render(_measured())
    assert "{{" not in page and "{%" not in page and "n/a" not in page
    assert "B submits 3 and C submits 1; the turns go on" in page
    assert "A of weight 1 and D of weight 3 each submit 50 briefs to the same API," in page
    assert (
        "| order | A (weight 1) | D (weight 3) |\n|---|---:|---:|\n| oldest first (before) | 40 (100%) | 0 (0%) |"
        in page
    )
    assert "A's own\nbacklog is through at turn 90 with fair turns and 61 oldest first" in page
    assert "Claims a round: 200 of each variant at 10 tenants." in page


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = _measured()
    del measured["weights"]["first"]
    with pytest.raises(jinja2.UndefinedError):
        fairness.render(measured)


def test_the_page_is_written_again_from_the_kept_measurements(tmp_path: pathlib.Path) -> None:
    (tmp_path / "fairness.json").write_text(json.dumps(_measured()))

    assert fairness.main(["--render", "--output", str(tmp_path / "fairness.md")]) == 0

    page = (tmp_path / "fairness.md").read_text()
    assert "| B | fair turns (now) | 3 | 14.0 / 39.2 / 42 | 7.0 / 19.6 / 21.0 | 72 (0.6 min) |" in page
    assert "| C | oldest first (before) | 1 | 43.0 / 43.0 / 43 | 21.5 / 21.5 / 21.5 | 74 (0.6 min) |" in page
    assert "up to 43 turns\n(0.4 min). With fair turns they wait at most 42 turns (21.0 s)" in page
    assert "| fair turns (now) | 10 (25%) | 30 (75%) |" in page
    assert "| 10 × 1,000 | fair turns (now) | 2.50 / 5.00 | 3.00, 2.00, 2.50 | 1.25x |" in page
    assert "a claim opportunity\nevery 0.5 s. A song then takes 15 s at the API" in page
