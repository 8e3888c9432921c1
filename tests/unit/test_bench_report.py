"""The benchmark report (bench/report.py).

Each section from the run's measurements, the charts beside it, and the page written again from the measurements
kept, without a run.
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
from typing import Any

import jinja2
import pytest
from castad_contracts import topology

from bench import report


def _q(p50: float, p99: float, n: int = 40) -> dict[str, float]:
    return {"n": n, "p50": p50, "p99": p99}


def _hop(total: float) -> dict[str, Any]:
    return {"total": _q(total, 2 * total), "confirmed": _q(total + 1, total + 3), "from_tx_start": _q(total + 2, 9)}


def _observed(total: float) -> dict[str, Any]:
    return {
        "total": _q(total, 2 * total),
        "commit_to_notify": _q(0.4, 0.9),
        "notify_to_broker": _q(1.1, 2.0),
        "broker_to_handler": _q(total - 1.5, total),
    }


def _side(rate: float, cpu: float, idle_p50: float) -> dict[str, Any]:
    throughput = {
        "rate": rate,
        "cpu_ms_per_pipeline": {"process": cpu / 2, "postgres": cpu / 2},
        "stages_seconds": 3.1,
        "seconds": 3.2,
    }
    return {"throughput": throughput, "idle_e2e_ms": _q(idle_p50, 2 * idle_p50)}


def _notify(**extra: Any) -> dict[str, Any]:
    variant = {"rate": 900.0, "latency_p50_ms": 1.1, "latency_p99_ms": 3.2, "latency_avg_ms": 1.3}
    return {
        "threads": 4,
        "totals": {v: dict(variant, round_rates=[880.0, 920.0]) for v in ("none", "after_commit", "in_transaction")},
        **extra,
    }


def results() -> dict[str, Any]:
    """Return one whole run's measurements, shaped as bench.run keeps them (JSON: every key a string)."""
    stages = topology.STAGES
    inside = {
        step: _q(value, value * 2)
        for step, value in (
            ("handler_to_claim_ms", 1.0),
            ("handler_to_started_commit_ms", 2.0),
            ("handler_to_recording_ms", 3.5),
            ("handler_to_completed_commit_ms", 5.0),
        )
    }
    peer_idle = {
        "handoff": _q(1.0, 4.0),
        "handoff_per_hop": {"client->step1": _q(1.1, 1.5), "step1->step2": _q(0.8, 1.1)},
        "e2e_ms": _q(3.0, 6.0),
    }
    peer_throughput = {"rate": 400.0, "cpu_ms_per_pipeline": {"workers": 2.0}, "submit_seconds": 0.06}
    peer_throughput["latency_ms"] = _q(20.0, 40.0)
    drain_round = {
        "first": "relay",
        "ratio": 0.65,
        "relay": {"rows": 1000, "rate": 3000.0},
        "raw": {"rate": 4600.0},
        "order": {"received": 1000, "out_of_order": 0, "duplicates": 0},
    }
    return {
        "run_id": "a1b2c3d4",
        "seconds": 1260.0,
        "args": {"warmup": "5"},
        "load": {"start": [0.5, 0.4, 0.3], "after sustained": [2.1, 1.8, 1.2]},
        "facts": {
            "date": "2026-11-28 00:00 UTC",
            "cores": 2,
            "cpu": "AMD EPYC",
            "memory": "8 GB",
            "kernel": "Linux 6.1",
            "python": "3.11.7",
            "packages": {"dramatiq": "1.17"},
            "postgres": {
                "version": "16.4",
                "synchronous_commit": "on",
                "fsync": "on",
                "wal_sync_method": "fdatasync",
                "shared_buffers": "128MB",
            },
            "rabbitmq": "3.12",
            "postgres_round_trip_ms": {"hot": 0.06, "after_pause": 0.15},
        },
        "castad": {
            "env": {"CASTAD_NAMESPACE": "bench-a1b2c3d4"},
            "commits_run": {"rate": 60.0},
            "throughput": {
                "pipelines": 200,
                "rate": 63.5,
                "concurrency": 8,
                "submit_seconds": 2.3,
                "stages_seconds": 3.1,
                "seconds": 3.15,
                "latency_ms": _q(900.0, 1800.0),
                "gateway_lag_ms": _q(12.0, 30.0),
                "cpu_ms_per_pipeline": {"api": 7.0, "relay": 3.0, "postgres": 10.0},
                "commits_per_pipeline": {"api": 4.7, "lyric": 3.5, "song": 3.2, "video": 3.6},
            },
            "idle": {
                "pipelines": 40,
                "handoff_stages": _hop(4.2),
                "handoff_per_hop": {"pipeline.requested": _hop(4.0), "lyric.completed": _hop(4.3)},
                "handoff_to_projection": _hop(3.9),
                "e2e_projection_ms": _q(44.5, 60.2),
                "e2e_client_ms": _q(50.0, 70.0),
                "inside_stage": {stage: inside for stage in stages},
                "observed": {
                    "pipelines": 20,
                    "handoff_stages": _observed(4.6),
                    "handoff_per_hop": {"pipeline.requested": _observed(4.4), "lyric.completed": _observed(4.8)},
                    "handoff_to_projection": _observed(4.1),
                },
            },
        },
        "dbos": {
            "commits_run": {"rate": 75.0},
            "throughput": {
                "pipelines": 200,
                "rate": 80.0,
                "concurrency": 8,
                "latency_ms": _q(700.0, 1400.0),
                "cpu_ms_per_pipeline": {"process": 10.0, "postgres": 7.2},
                "commits_per_pipeline": 16.2,
            },
            "idle": {"pipelines": 40, "e2e_database_ms": _q(13.0, 20.1)},
        },
        "peer": {
            "defaults": {"processes": 2, "threads": 8, "idle": peer_idle, "throughput": peer_throughput},
            "confirms": {"processes": 2, "threads": 8, "idle": peer_idle, "throughput": peer_throughput},
        },
        "paired": {
            "idle_lot": 15,
            "rounds": [
                {"order": ["castad", "dbos"], "castad": _side(60.0, 30.0, 40.0), "dbos": _side(80.0, 20.0, 15.0)},
                {"order": ["dbos", "castad"], "castad": _side(63.5, 29.7, 44.0), "dbos": _side(80.0, 17.2, 16.0)},
                {"order": ["castad", "dbos"], "castad": _side(70.0, 28.0, 42.0), "dbos": _side(82.0, 17.0, 15.5)},
            ],
        },
        "drain": {
            "per_pipeline": 10,
            "fill_seconds": 1.0,
            "relay": {
                "rows": 1000,
                "rate": 3000.0,
                "seconds_from_start": 0.4,
                "seconds_publishing": 0.3,
                "cpu_ms_per_1000_rows": {"relay": 200.0, "postgres": 55.0},
            },
            "raw": {"rate": 4600.0, "window": 1000, "seconds": 0.2},
            "order": {"received": 1000, "out_of_order": 0, "duplicates": 0},
            "rounds": [drain_round, dict(drain_round, first="raw", ratio=0.63), dict(drain_round, ratio=0.74)],
        },
        "sustained": {
            "rate": 31.7,
            "pipelines": 5700,
            "submitted_late": 0,
            "flat": False,
            "first_minute_p99_ms": 84.0,
            "worst_minute_p99_ms": 503.0,
            "minutes": {"0": _q(60.0, 84.0, 1900), "1": _q(62.0, 503.0, 1900), "2": _q(58.0, 90.0, 1900)},
            "servers": {
                minute: {
                    "checkpoints": 0,
                    "full_page_images": 1200,
                    "wal_mb": 30.5,
                    "autovacuums": 0,
                    "load": 1.5,
                    "busy": 0.8,
                    "iowait": 0.01,
                    "steal": 0.0,
                    "cpu_s": {"api": 20.0, "relay": 6.0},
                }
                for minute in ("0", "1", "2")
            },
            "tail_parts": {minute: {"to lyric": 5.0, "lyric": 3.0, "to finished": 9.0} for minute in ("0", "1", "2")},
        },
        "notify": {
            "python": _notify(per_thread=1000, rounds=3),
            "pgbench": _notify(pgbench="pgbench (PostgreSQL) 16.4"),
        },
        "replicas": _replicas(),
    }


def _replica_round(config: str, rate: float) -> dict[str, Any]:
    two = config == "two of each"
    spread = {"lyric-1": 110, "lyric-2": 90} if two else {"lyric-1": 200}
    return {
        "config": config,
        "rate": rate,
        "seconds": 200 / rate,
        "latency_ms": _q(150.0, 400.0),
        "cpu_ms_per_pipeline": {"api": 8.0, "lyric": 6.0 if two else 5.0, "postgres": 12.0},
        "attempts": {"lyric": spread},
        "leaders": {"api": {"holder": "relay-2" if two else "relay-1", "takeovers": 1 if two else 0}},
    }


def _replicas() -> dict[str, Any]:
    """Return the replicas part's measurements: two pairs of rounds, two replicas of each worker and one."""
    rounds = [("two of each", 50.0), ("one of each", 60.0), ("one of each", 58.0), ("two of each", 54.0)]
    return {
        "cores": 2,
        "gateways": 1,
        "replicas": 2,
        "replicated": list(topology.WORKERS),
        "pipelines": 200,
        "concurrency": 8,
        "rounds": [_replica_round(config, rate) for config, rate in rounds],
        "checked": {
            "pipelines": 820,
            "succeeded": 820,
            "completed_events": dict.fromkeys(topology.STAGES, 820),
            "outbox_rows": 6560,
            "routed": 6560,
            "timeline_entries": 6560,
            "dead_letters": 0,
            "parked": 0,
        },
        "findings": [],
    }


def _rows(lines: list[str], first_cell: str) -> list[list[str]]:
    """Return the cells of every table row whose first cell starts with first_cell."""
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in lines
        if line.startswith("| ") and line[2:].startswith(first_cell)
    ]


def _section(page: str, heading: str) -> list[str]:
    """Return the lines of the page's section `heading` (its `#` marks included), up to the next of its level."""
    lines = page.split("\n")
    start = lines.index(heading)
    level = heading.split(" ")[0]
    ends = [n for n, line in enumerate(lines) if n > start and line.split(" ")[0] in (level, level[:-1], "#")]
    return lines[start : ends[0] if ends else len(lines)]


def test_the_report_shows_its_sections_in_order_each_from_the_measurements() -> None:
    page = report.render(results())
    assert re.findall(r"^## (.*)$", page, re.M) == [
        "Machine and servers",
        "Summary",
        "A. Castad end to end, instant providers",
        "B. The peer: a plain Dramatiq pipeline",
        "D. The durable peer: DBOS",
        "E. Draining an outbox backlog",
        "F. A long run at a steady rate",
        "Where an idle handoff's time goes",
        "C. NOTIFY inside the transaction or after the commit",
        "G. Two replicas of every worker beside one",
        "How to reproduce",
    ]
    assert "run `a1b2c3d4`" in page and page.endswith("compare across runs.\n")


def test_the_template_writes_every_figure_of_a_sample_run_and_names_none_it_was_not_given() -> None:
    page = report.render(results())
    assert "{{" not in page and "{%" not in page and "n/a" not in page
    [python] = _rows(page.split("\n"), "Python, 4 threads")
    assert python == ["Python, 4 threads", "900", "900", "900", "1.00×"]
    assert "| PostgreSQL | 16.4 on 127.0.0.1 (synchronous_commit=on, fsync=on, wal_sync_method=fdatasync," in page
    assert "start: 0.50 / 0.40 / 0.30; after sustained: 2.10 / 1.80 / 1.20" in page
    [cpu] = _rows(_section(page, "## A. Castad end to end, instant providers"), "7.0 ")
    assert cpu == ["7.0", "3.0", "10.0", "20.0"]


def test_a_measurement_missing_from_the_kept_file_fails_the_report_instead_of_leaving_a_gap() -> None:
    r = results()
    del r["drain"]["relay"]["seconds_publishing"]
    with pytest.raises(jinja2.UndefinedError):
        report.render(r)


def test_the_summary_meets_the_throughput_target_only_when_the_median_round_does() -> None:
    r = results()
    [throughput] = _rows(_section(report.render(r), "## Summary"), "throughput ≥ 1.0× DBOS's")
    assert throughput[1].startswith("median of 3 paired rounds 0.79× (rounds 0.75-0.85×)")
    assert throughput[2] == "**not met**"
    for one in r["paired"]["rounds"]:
        one["castad"]["throughput"]["rate"] = 1.1 * one["dbos"]["throughput"]["rate"]
    [throughput] = _rows(_section(report.render(r), "## Summary"), "throughput ≥ 1.0× DBOS's")
    assert throughput[2] == "**met**"


def test_the_paired_rounds_show_each_round_its_ratios_and_the_throughput_chart() -> None:
    lines = _section(report.render(results()), "### Paired rounds")
    rounds = _rows(lines, "1 ") + _rows(lines, "2 ") + _rows(lines, "3 ")
    assert [row[:4] for row in rounds] == [
        ["1", "castad", "60.0 / 80.0", "0.75×"],
        ["2", "dbos", "63.5 / 80.0", "0.79×"],
        ["3", "castad", "70.0 / 82.0", "0.85×"],
    ]
    [median] = _rows(lines, "median")
    assert median[3] == "0.79×" and median[5] == "1.65×"
    assert "![Pipelines a second in each paired round, Castad beside DBOS](benchmarks-throughput.svg)" in lines


def test_a_drain_round_that_lost_a_pipelines_order_is_shown_broken_and_misses_its_target() -> None:
    r = results()
    drain = "## E. Draining an outbox backlog"
    assert [row[5] for row in _rows(_section(report.render(r), drain), "1 ")] == ["in order, once each"]
    r["drain"]["rounds"][0]["order"]["out_of_order"] = 1
    page = report.render(r)
    assert [row[5] for row in _rows(_section(page, drain), "1 ")] == ["BROKEN"]
    [target] = _rows(_section(page, "## Summary"), "a 1,000-row outbox backlog")
    assert "ORDER OR COUNT BROKEN" in target[1] and target[2] == "**not met**"


def test_the_steady_run_lists_each_minute_beside_what_the_servers_did_and_its_chart() -> None:
    lines = _section(report.render(results()), "## F. A long run at a steady rate")
    minutes = [_rows(lines, f"{minute} | 1900")[0] for minute in (1, 2, 3)]
    assert [row[2:4] for row in minutes] == [["60", "84"], ["62", "503"], ["58", "90"]]
    assert minutes[0][4:] == ["0", "1,200", "30.5", "0", "1.50", "80%", "1%", "0%"]
    assert "![The steady run's p50 and p99 in ms, minute by minute](benchmarks-steady.svg)" in lines


def test_the_replicas_section_shows_each_round_the_spread_and_the_two_cores_note_and_fails_on_a_finding() -> None:
    r = results()
    lines = _section(report.render(r), "## G. Two replicas of every worker beside one")
    rows = [_rows(lines, f"{number} | ")[0] for number in range(1, 5)]
    assert [row[1:3] for row in rows] == [
        ["two of each", "50.0"],
        ["one of each", "60.0"],
        ["one of each", "58.0"],
        ["two of each", "54.0"],
    ]
    assert rows[0][3] == "26.0" and rows[1][3] == "25.0"
    page = "\n".join(lines)
    assert "two of each 52.0 pipelines/s, one of each 59.0: 0.88× the throughput" in page
    assert "lyric-1 110, lyric-2 90" in page and "relay-2 (1 takeovers)" in page
    assert "This machine has 2 cores" in page and "cannot show what replicas add" in page
    assert "**No finding**" in page
    r["replicas"]["findings"] = ["p1: lyric SUCCEEDED with 1 succeeded attempts and 2 completed events"]
    page = "\n".join(_section(report.render(r), "## G. Two replicas of every worker beside one"))
    assert "**1 findings: the run failed.**" in page and "- p1: lyric SUCCEEDED" in page
    assert "No finding" not in page


def test_a_run_without_the_replicas_part_has_no_replicas_section() -> None:
    r = results()
    del r["replicas"]
    assert "## G." not in report.render(r)


def test_the_summary_shows_the_idle_latency_chart() -> None:
    chart = (
        "![Idle end to end and stage handoff, p50 and p99 in ms: Castad, DBOS and plain Dramatiq](benchmarks-idle.svg)"
    )
    assert chart in _section(report.render(results()), "## Summary")


def test_the_charts_are_the_same_file_for_the_same_measurements_and_follow_them() -> None:
    r = results()
    first = report.figures(r)
    assert sorted(first) == ["benchmarks-idle.svg", "benchmarks-steady.svg", "benchmarks-throughput.svg"]
    assert report.figures(copy.deepcopy(r)) == first
    r["paired"]["rounds"][1]["castad"]["throughput"]["rate"] = 66.6
    again = report.figures(r)
    assert again["benchmarks-throughput.svg"] != first["benchmarks-throughput.svg"]
    assert again["benchmarks-steady.svg"] == first["benchmarks-steady.svg"]
    assert "<dc:date>" not in again["benchmarks-throughput.svg"]
    assert "66.6" in again["benchmarks-throughput.svg"] and "66.6" not in first["benchmarks-throughput.svg"]


def test_the_report_is_written_again_from_its_kept_measurements_with_every_chart_it_links(
    tmp_path: pathlib.Path,
) -> None:
    kept = tmp_path / "benchmarks.json"
    kept.write_text(json.dumps(results()))
    output = tmp_path / "benchmarks.md"
    assert report.main(["--results", str(kept), "--output", str(output)]) == 0
    page = output.read_text()
    linked = re.findall(r"!\[[^]]*\]\(([^)]+\.svg)\)", page)
    assert sorted(linked) == ["benchmarks-idle.svg", "benchmarks-steady.svg", "benchmarks-throughput.svg"]
    assert all((tmp_path / name).read_text().startswith("<?xml") for name in linked)
    written = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    assert report.main(["--results", str(kept), "--output", str(output)]) == 0
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == written


def test_writing_again_without_kept_measurements_names_the_missing_file(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        report.main(["--results", str(tmp_path / "none.json"), "--output", str(tmp_path / "benchmarks.md")])
    assert "--results" in capsys.readouterr().err and not (tmp_path / "benchmarks.md").exists()
