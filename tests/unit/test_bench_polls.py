"""The polls benchmark's page says what its measurements say."""

from __future__ import annotations

import jinja2
import pytest

from bench import polls


def _run(variant: str, jobs: int, cpu_ms: float, late_max_s: float, on_time: float) -> dict:
    return {
        "variant": variant,
        "jobs": jobs,
        "polled": jobs,
        "batch": 100 if variant == "batched" else 1,
        "threads": 64,
        "due_per_s": jobs / 100,
        "late_s": {"n": jobs, "p50": late_max_s / 4, "p90": late_max_s / 2, "p99": late_max_s / 2, "max": late_max_s},
        "on_time_share": on_time,
        "process_cpu_ms_per_poll": cpu_ms,
        "postgres_cpu_ms_per_poll": 1.0,
        "commits_per_poll": 2.5 if variant == "claimed" else 0.03,
    }


def test_the_page_shows_each_run_and_what_the_before_run_could_reach():
    measured = {
        "runs": [_run("claimed", 3_000, 3.0, 0.5, 1.0), _run("batched", 100_000, 0.2, 3.0, 0.95)],
        "window_s": 100.0,
        "answer_s": 0.02,
        "on_time_s": 2.0,
        "facts": {"date": "2026-11-28", "cores": 2, "cpu": "cpu", "postgres": "PostgreSQL 15", "load": "1 / 1 / 1"},
    }
    page = polls.render(measured)
    assert (
        "| each poll a claim (before) | 3,000 | 30 | 3,000 | 100.0% | 0.12 / 0.25 / 0.50 | 3.00 | 1.00 | 2.500 |"
        in page
    )
    assert (
        "| batches of the prober (now) | 100,000 | 1,000 | 100,000 | 95.0% | 0.75 / 1.50 / 3.00 | 0.20 | 1.00 | 0.030 |"
        in page
    )
    assert "at 4.0 ms of CPU a poll, two cores poll at most about 500 a second" in page
    assert "claims up to 100 due polls in one transaction, asks them 64 at a time" in page


def _measured() -> dict:
    return {
        "runs": [_run("claimed", 3_000, 3.0, 0.5, 1.0), _run("batched", 100_000, 0.2, 3.0, 0.95)],
        "window_s": 100.0,
        "answer_s": 0.02,
        "on_time_s": 2.0,
        "facts": {"date": "2026-11-28", "cores": 2, "cpu": "cpu", "postgres": "PostgreSQL 15", "load": "1 / 1 / 1"},
    }


def test_the_template_writes_every_figure_and_names_none_it_was_not_given():
    page = polls.render(_measured())
    assert "{{" not in page and "{%" not in page
    assert (
        "falling due evenly over 100 s; the provider (in the benchmark's process) answers each poll"
        ' "not yet" after 20 ms' in page
    )
    assert "| polls | jobs | due a second | polled | within 2 s of due |" in page
    assert "Run 2026-11-28 on 2 cores, cpu; PostgreSQL 15;\nload average at the start 1 / 1 / 1." in page


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap():
    measured = _measured()
    del measured["runs"][1]["commits_per_poll"]
    with pytest.raises(jinja2.UndefinedError):
        polls.render(measured)
