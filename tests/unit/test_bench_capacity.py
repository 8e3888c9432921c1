"""The capacity model (bench/capacity.py): topic routing as RabbitMQ does it, the projection's arithmetic from the
measurements, and the page written again from the measurements kept beside it."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jinja2
import pytest
from castad_contracts import topology

from bench import capacity


def _measured() -> dict[str, Any]:
    return {
        "facts": {"date": "2026-11-28 05:00 UTC", "cores": 2, "cpu": "test", "postgres": "15", "load": "0 / 0 / 0"},
        "orchestration": {
            "pipelines": 300,
            "concurrency": 16,
            "rate": 50.0,
            "cpu_ms": {
                "api": 4.0,
                "lyric": 2.0,
                "song": 2.0,
                "video": 2.0,
                "relay": 1.0,
                "postgres": 6.0,
                "rabbitmq": 1.0,
                "client": 3.0,
            },  # fmt: skip
            "commits": {"api": 5.0, **dict.fromkeys(topology.STAGES, 3.0)},
            "rows": {"api": 20.0, **dict.fromkeys(topology.STAGES, 10.0)},
            "wal_bytes": {"api": 10_000.0, **dict.fromkeys(topology.STAGES, 5_000.0), "no relation": 900.0},
            "events": {svc: {"events": 2.0, "deliveries": 3.0} for svc in topology.WITH_DATABASE},
        },
        "ceilings": {
            "commits_per_s": 10_000.0,
            "relay_rows_per_s": 4_000.0,
            "relay_cpu_ms_per_1000_rows": {"relay": 100.0, "postgres": 50.0},
            "publish_rows_per_s": 6_000.0,
        },
        "waiting": {
            "waiting": 400,
            "window_s": 60.0,
            "polls": 600,
            "polls_per_s": 10.0,
            "cpu_ms_per_poll": {"song": 2.0, "postgres": 1.0},
            "commits_per_poll": 2.0,
            "poll_first_s": 5.0,
            "poll_max_s": 30.0,
        },
    }


def test_the_projection_multiplies_the_measured_costs_out() -> None:
    plan = capacity.model(_measured(), rate=5_000, waiting_jobs=1_000_000)
    assert plan["parts"]["api"]["cores"] == pytest.approx(20.0)  # 4 ms x 5,000/s
    assert plan["parts"]["api"]["replicas"] == 29  # at 70 % of a core each
    assert "client" not in plan["parts"]  # the harness is not part of Castad
    api = plan["databases"]["api"]
    assert api["commits_per_s"] == pytest.approx(25_000)
    assert api["servers"] == 5  # at half of 10,000 commits/s
    assert api["outbox_leaders"] == 3  # 10,000 events/s over 4,000 rows/s a leader
    assert api["wal_mb_per_s"] == pytest.approx(50.0)
    assert plan["polls_per_s"] == pytest.approx(1_000_000 / 30)
    assert plan["poll_cores"]["song"] == pytest.approx(66.67, rel=1e-3)
    assert plan["deliveries_per_s"] == pytest.approx(4 * 3.0 * 5_000)
    assert plan["total_cores"] == pytest.approx(5 * (4 + 2 + 2 + 2 + 1 + 6 + 1) + 1_000_000 / 30 * 3 / 1000)


def test_the_page_is_written_again_from_the_kept_measurements(tmp_path: pathlib.Path) -> None:
    kept = tmp_path / "capacity.json"
    kept.write_text(json.dumps(_measured()))
    assert capacity.main(["--render", "--output", str(tmp_path / "capacity.md")]) == 0
    page = (tmp_path / "capacity.md").read_text()
    assert "| api | 20.0 | 29 |" in page
    assert "33,333 polls a second" in page
    assert "**Measured**" in page and "**All projected.**" in page


def test_with_callbacks_the_waiting_jobs_are_projected_at_the_safety_nets_longest_wait(tmp_path: pathlib.Path) -> None:
    measured = _measured()
    measured["waiting"].update(poll_max_called_back_s=300.0, probe_batch=200)
    plan = capacity.model(measured, rate=5_000, waiting_jobs=1_000_000)
    assert plan["polls_per_s"] == pytest.approx(1_000_000 / 300)
    assert plan["polls_per_s_without_callbacks"] == pytest.approx(1_000_000 / 30)
    assert plan["poll_commits_per_s"] == pytest.approx(2.0 * 1_000_000 / 300)

    kept = tmp_path / "capacity.json"
    kept.write_text(json.dumps(measured))
    assert capacity.main(["--render", "--output", str(tmp_path / "capacity.md")]) == 0
    page = (tmp_path / "capacity.md").read_text()
    assert "3,333 polls a second" in page and "33,333 polls a second would need 100.0 cores" in page
    assert "a batch of polls is two commits" in page


def test_the_template_writes_every_figure_of_the_sample_and_names_none_it_was_not_given() -> None:
    page = capacity.render(_measured())
    assert "{{" not in page and "{%" not in page and "n/a" not in page
    assert "| api | 5.0 | 20.0 | 10,000 | 2.0 | 3.0 |" in page  # measured, per database
    assert "| api | 25,000 | 100,000 | 50.0 | 10,000 | 5 | 3 |" in page  # projected, per database
    assert "## Projected: 5,000 pipelines a second and 1,000,000 jobs waiting" in page
    assert "replicas are planned at 70% of a core each" in page
    assert "(a claim and a record, each its own transaction)." in page


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = _measured()
    del measured["ceilings"]["publish_rows_per_s"]
    with pytest.raises(jinja2.UndefinedError):
        capacity.render(measured)
