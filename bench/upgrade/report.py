"""docs/reports/upgrade.md: each mix of releases a rollout passed through, its pipelines and how they ended.

The run's measurements are kept beside the page in upgrade.json and the page, its words
bench/templates/upgrade.md.j2's, is written from them (`python -m bench.upgrade --render` writes it again).
"""

from __future__ import annotations

import collections
import datetime as dt
import os
import pathlib
from typing import Any

from castad_testkit import machine

from bench import pages
from bench.upgrade import run

OUTCOMES = ("SUCCEEDED", "FAILED", "CANCELED")  # how a pipeline ends: any other status is one not ended


def measurements(result: run.Result) -> dict[str, Any]:
    """Return what the page shows of a rollout, as upgrade.json keeps it."""
    old = result.old.name
    held: collections.Counter[str] = collections.Counter()
    for of_process in result.held.values():
        held.update(of_process)
    return {
        "date": f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M}",
        "seconds": result.seconds,
        "cores": os.cpu_count(),
        "cpu": machine.cpu_model(),
        "old": {"name": old, "commit": result.old.commit},
        "new": {"name": result.new.name, "commit": result.new.commit},
        "settings": {
            "replicas": result.settings.replicas,
            "phase_s": result.settings.phase_s,
            "rate_per_s": result.settings.rate_per_s,
        },
        "findings": result.findings,
        "phases": [
            {
                "name": phase.name,
                "on_old": sorted(name for name, release in phase.running.items() if release == old),
                "on_new": sorted(name for name, release in phase.running.items() if release != old),
                "accepted": len(phase.accepted),
                "ended": dict(ended),
            }
            for phase, ended in run.outcomes_by_phase(result)
        ],
        "held": [
            [what, times, sorted(name for name, counts in result.held.items() if counts[what])]
            for what, times in sorted(held.items())
        ],
    }


def write(result: run.Result, path: pathlib.Path) -> None:
    """Keep the rollout's measurements beside the page and write the page from them."""
    pages.write(path, render, measurements(result))


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/upgrade.md.j2 from the measurements."""
    phases = [
        {**phase, "not_ended": sum(count for status, count in phase["ended"].items() if status not in OUTCOMES)}
        for phase in measured["phases"]
    ]
    return pages.render("upgrade.md.j2", **{**measured, "phases": phases}, outcomes=OUTCOMES)
