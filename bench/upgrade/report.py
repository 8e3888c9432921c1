"""docs/reports/upgrade.md: each mix of releases a rollout passed through, its pipelines and how they ended."""

from __future__ import annotations

import collections
import datetime as dt
import os
import pathlib

from castad_testkit import machine

from bench.upgrade import run

OUTCOMES = ("SUCCEEDED", "FAILED", "CANCELED")


def write(result: run.Result, path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(result))


def render(result: run.Result) -> str:
    settings = result.settings
    lines = [
        "# Rolling upgrade",
        "",
        f"From {result.old.name} (`{result.old.commit[:12]}`) to {result.new.name} (`{result.new.commit[:12]}`),"
        f" {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {result.seconds:.0f} s, on {os.cpu_count()} cores"
        f" ({machine.cpu_model()}).",
        f"`make upgrade-test`: {settings.replicas} replicas of every service, {settings.phase_s:g} s of traffic in"
        f" each mix of releases at {settings.rate_per_s:g} brief/s (every other one with three uploaded photos),"
        " an operator cancelling and retrying, stage providers that fail a third of their calls; the schema"
        " migrated to the new release's first, the services rolled in CHANGELOG.md's order (relays, gateway,"
        " stages), a new replica ready before an old one stops.",
        "",
        "**No findings.**" if not result.findings else f"**{len(result.findings)} findings:**",
        *[f"- {finding}" for finding in result.findings],
        "",
        "## Each mix of releases",
        "",
        "| phase | old release | new release | pipelines accepted | " + " | ".join(OUTCOMES) + " | not ended |",
        "|---|---|---|---|" + "---|" * len(OUTCOMES) + "---|",
    ]
    for phase, ended in run.outcomes_by_phase(result):
        on_old = sorted(name for name, release in phase.running.items() if release == result.old.name)
        on_new = sorted(name for name, release in phase.running.items() if release != result.old.name)
        late = sum(count for status, count in ended.items() if status not in OUTCOMES)
        counts = " | ".join(str(ended.get(status, 0)) for status in OUTCOMES)
        lines.append(
            f"| {phase.name} | {', '.join(on_old) or '-'} | {', '.join(on_new) or '-'} | {len(phase.accepted)}"
            f" | {counts} | {late} |"
        )
    held: collections.Counter[str] = collections.Counter()
    for of_process in result.held.values():
        held.update(of_process)
    lines += ["", "## Held or handed back", ""]
    if not held:
        lines.append("Nothing: no process held an event or a job for the other release, none handed an attempt back.")
    else:
        lines += ["| what | times | by |", "|---|---|---|"]
        for what, times in sorted(held.items()):
            by = sorted(name for name, counts in result.held.items() if counts[what])
            lines.append(f"| {what} | {times} | {', '.join(by)} |")
        lines += [
            "",
            "An attempt handed back is a stopping replica's whose stop grace ran out: uncounted, it goes on on another"
            " replica. A relay hands an outbox's lease over as relays come and go, so that each leads its share.",
        ]
    return "\n".join(lines) + "\n"
