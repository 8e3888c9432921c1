"""The benchmark report (docs/reports/benchmarks.md) and its charts, from one run's measurements.

`make bench` runs the benchmark, keeps its measurements beside the report (benchmarks.json) and writes the
report and its charts from them; `python -m bench.report` writes both again from those measurements without
running anything. The report's words, headings and tables are its template's, bench/templates/benchmarks.md.j2
(the section on replicas in replicas-rounds.md.j2, which bench-replicas' page shows too); this module derives the
figures it shows from the measurements. How the benchmark came to be run as it is, and what each change measured
with it moved, are dated pages written by hand under docs/performance/, to which the report links.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from castad_testkit import charts, scratch

from bench import pages, paired

HANDOFF_P50_MS = 5.0
HANDOFF_P99_MS = 25.0
CHANGES_PAGE = "../performance/changes-2026-11-27.md"  # the hand-written record of the changes, from the report
OUTPUT = scratch.REPORTS / "benchmarks.md"


def render(r: dict[str, Any]) -> str:
    """Return the report's Markdown, written by its template from one run's results."""
    return pages.render("benchmarks.md.j2", **context(r))


def context(r: dict[str, Any]) -> dict[str, Any]:
    """Return what the report's template reads: the run's results, `r`, and the figures derived from them."""
    castad, peer = r["castad"], r["peer"]["defaults"]
    idle, tput = castad["idle"], castad["throughput"]
    rounds = r["paired"]["rounds"]
    ratios, medians = _paired_ratios(rounds)
    drain_ratios = [measured["ratio"] for measured in r["drain"]["rounds"]]
    in_order = [_in_order(measured["order"], measured["relay"]["rows"]) for measured in r["drain"]["rounds"]]
    cpu_castad = paired.cpu_ms(tput)
    used, cores = cpu_castad * tput["rate"] / 1000, r["facts"]["cores"] or 1
    return {
        "r": r,
        "handoff_p50_ms": HANDOFF_P50_MS,
        "handoff_p99_ms": HANDOFF_P99_MS,
        "changes_page": CHANGES_PAGE,
        "charts": {name: _chart_file(name) for name in ("idle", "throughput", "steady")},
        "cpu": {
            "castad": cpu_castad,
            "dbos": paired.cpu_ms(r["dbos"]["throughput"]),
            "peer": sum(peer["throughput"]["cpu_ms_per_pipeline"].values()),
        },
        "commits_castad": sum(tput["commits_per_pipeline"].values()),
        "ratios": ratios,
        "medians": medians,
        "paired_cpu": [{side: paired.cpu_ms(one[side]["throughput"]) for side in ("castad", "dbos")} for one in rounds],
        "drain": {
            "ratios": drain_ratios,
            "median": statistics.median(drain_ratios),
            "in_order": in_order,
            "ordered": all(in_order),
        },
        "idle_time": {
            "handoffs": sum(hop["total"]["p50"] for hop in idle["handoff_per_hop"].values()),
            "stages": sum(stage["handler_to_completed_commit_ms"]["p50"] for stage in idle["inside_stage"].values()),
        },
        "cores_used": {"used": used, "cores": cores, "cpu_bound": used >= 0.7 * cores},
        "replicas": replicas(r["replicas"]) if "replicas" in r else None,
    }


def replicas(measured: dict[str, Any]) -> dict[str, Any]:
    """Return what the replicas' section (replicas-rounds.md.j2) reads: the part's measurements and their means.

    The installations (two of each worker, one of each) by name, the mean rate of each over its rounds, and each
    part's CPU a pipeline, the mean over each installation's rounds.
    """
    rounds = measured["rounds"]
    configs = sorted({one["config"] for one in rounds}, reverse=True)
    return {
        "measured": measured,
        "configs": configs,
        "rates": {c: statistics.mean(one["rate"] for one in rounds if one["config"] == c) for c in configs},
        "cpu_means": {
            service: [
                statistics.mean(one["cpu_ms_per_pipeline"].get(service, 0.0) for one in rounds if one["config"] == c)
                for c in configs
            ]
            for service in sorted({name for one in rounds for name in one["cpu_ms_per_pipeline"]})
        },
    }


def figures(r: dict[str, Any]) -> dict[str, str]:
    """Return the report's charts as SVG documents, by the file name the report gives each."""
    return {
        _chart_file("throughput"): charts.grouped_bars(
            "Throughput in each paired round",
            [f"round {number}" for number in range(1, len(r["paired"]["rounds"]) + 1)],
            {
                name: [one[side]["throughput"]["rate"] for one in r["paired"]["rounds"]]
                for name, side in (("Castad", "castad"), ("DBOS", "dbos"))
            },
            unit="pipelines/s",
        ),
        _chart_file("idle"): charts.grouped_bars(
            "An idle pipeline: end to end and a stage handoff",
            ["end to end p50", "end to end p99", "handoff p50", "handoff p99"],
            _idle_latencies(r),
            unit="ms",
        ),
        _chart_file("steady"): charts.lines(
            "The steady run: latency by the minute a pipeline was created",
            [int(minute) + 1 for minute in r["sustained"]["minutes"]],
            {q: [summary[q] for summary in r["sustained"]["minutes"].values()] for q in ("p50", "p99")},
            x_label="minute",
            unit="ms",
        ),
    }


def write(r: dict[str, Any], output: pathlib.Path) -> None:
    """Write the report and its charts beside it."""
    for name, svg in figures(r).items():
        (output.parent / name).write_text(svg)
    output.write_text(render(r))


def _chart_file(name: str) -> str:
    return f"benchmarks-{name}.svg"


def _paired_ratios(rounds: list[dict[str, Any]]) -> tuple[dict[str, list[float]], dict[str, float]]:
    ratios = paired.ratios(rounds)
    return ratios, {name: statistics.median(values) for name, values in ratios.items()}


def _idle_latencies(r: dict[str, Any]) -> dict[str, Sequence[float | None]]:
    """Return idle end to end and stage handoff, p50 and p99, of each installation (DBOS has no handoff)."""
    idle, peer = r["castad"]["idle"], r["peer"]["defaults"]["idle"]
    quantiles = ("p50", "p99")
    return {
        "Castad": [idle["e2e_projection_ms"][q] for q in quantiles]
        + [idle["handoff_stages"]["total"][q] for q in quantiles],
        "DBOS": [r["dbos"]["idle"]["e2e_database_ms"][q] for q in quantiles] + [None, None],
        "plain Dramatiq": [peer["e2e_ms"][q] for q in quantiles] + [peer["handoff"][q] for q in quantiles],
    }


def _in_order(read_back: dict[str, Any], rows: int) -> bool:
    """Whether a drain's queue gave back every row once, each pipeline's in order."""
    return bool(read_back["out_of_order"] == 0 and read_back["duplicates"] == 0 and read_back["received"] == rows)


def main(argv: list[str] | None = None) -> int:
    """Write the report and its charts again from a run's kept measurements."""
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=main.__doc__)
    parser.add_argument("--results", type=pathlib.Path, default=OUTPUT.with_suffix(".json"))
    parser.add_argument("--output", type=pathlib.Path, default=OUTPUT)
    args = parser.parse_args(argv)
    if not args.results.exists():
        parser.error(f"--results: {args.results} does not exist (`make bench` keeps it beside the report)")
    write(json.loads(args.results.read_text()), args.output)
    print(f"written to {args.output} and its charts beside it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
