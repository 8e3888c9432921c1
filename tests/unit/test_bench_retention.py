"""The keys-and-retention benchmark (bench/retention.py): what each database must delete at the capacity model's
rate, and the page written again from the measurements kept beside it."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jinja2
import pytest

from bench import retention
from tests.unit.test_bench_capacity import _measured as capacity_measured


def _drain(rate: float, writes: float) -> dict[str, float]:
    return {"deleted": rate * 10, "seconds": 10.0, "rate": rate, "writes": writes, "batch": 500, "pause_s": 0.2}


def _measured() -> dict[str, Any]:
    return {
        "facts": {"date": "2026-11-28 08:00 UTC", "cores": 2, "cpu": "test", "postgres": "15", "load": "0 / 0 / 0"},
        "keys": {
            "prefill": 1_500_000,
            "writers": 4,
            "round_s": 15.0,
            "rounds": {
                "uuid4": [{"inserts": 30_000, "rate": 2_000.0, "wal_per_insert": 4_000.0}] * 2,
                "uuid7": [{"inserts": 60_000, "rate": 4_000.0, "wal_per_insert": 400.0}] * 2,
            },
        },
        "retention": {
            "fill": 300_000,
            "drain_s": 15.0,
            "service_writers": 2,
            "max_batch": 10_000,
            "quick_s": 0.25,
            "busy_share": 0.2,
            "alone": {"writes": 5_000.0},
            "fixed": {"outbox": _drain(2_500.0, 4_500.0), "inbox": _drain(2_400.0, 4_600.0)},
            "growing": {"outbox": _drain(20_000.0, 4_000.0), "inbox": _drain(25_000.0, 4_250.0)},
        },
        "need": retention.need(capacity_measured(), rate=5_000),
    }


def test_each_database_must_delete_its_events_its_deliveries_and_the_gateway_its_timeline() -> None:
    need = retention.need(capacity_measured(), rate=5_000)

    # The fixture's databases publish 2 events a pipeline each: the gateway receives the stages' 6.
    assert need["api"] == pytest.approx(
        {"outbox": 10_000, "inbox": 30_000, "timeline": 40_000, "total": 80_000, "servers": 5}
    )
    assert need["song"]["outbox"] == 10_000 and need["song"]["inbox"] == 5_000 and need["song"]["timeline"] == 0


def test_the_page_is_written_again_from_the_kept_measurements(tmp_path: pathlib.Path) -> None:
    (tmp_path / "retention.json").write_text(json.dumps(_measured()))

    assert retention.main(["--render", "--output", str(tmp_path / "retention.md")]) == 0

    page = (tmp_path / "retention.md").read_text()
    assert "| time-ordered, version 7 (now) | 4,000 | 2.00x | 4,000, 4,000 | 400 | 0.10x |" in page
    assert "| no retention | | | | 5,000 | 1.00x |" in page
    assert (
        "| batches that grow while a backlog lasts (now) | inbox | 25,000 | 250,000 in 10.0 s | 4,250 | 0.85x |" in page
    )
    assert "| api | 10,000 | 30,000 | 40,000 | 80,000 | 33.3 | 4.0 | 5 | 16,000 |" in page
    assert "## Whether to partition" in page


def test_the_template_writes_every_figure_of_the_sample_and_names_none_it_was_not_given() -> None:
    page = retention.render(_measured())
    assert "{{" not in page and "{%" not in page and "n/a" not in page
    assert "| random, version 4 (before) | 2,000 | 1.00x | 2,000, 2,000 | 4,000 | 1.00x |" in page
    assert "| batches of `batch` rows (before) | outbox | 2,500 | 25,000 in 10.0 s | 4,500 | 0.90x |" in page
    assert "## What retention must delete at 5,000 pipelines a second (projected)" in page
    assert "deleting takes at most 20% of the pruner's time" in page
    assert "One pruner deleted 2,400 rows a second before (the slower table's) and 20,000 now," in page


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = _measured()
    del measured["retention"]["max_batch"]
    with pytest.raises(jinja2.UndefinedError):
        retention.render(measured)
