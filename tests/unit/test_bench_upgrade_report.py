"""The rolling upgrade's page (bench/upgrade/report.py): a rollout's measurements kept, the page written from them."""

from __future__ import annotations

import collections
import json
import pathlib

import jinja2
import pytest

from bench.upgrade import releases, report, run


def _result(findings: list[str], held: dict[str, collections.Counter[str]]) -> run.Result:
    old = releases.Release("0b8a9212", "0b8a9212659e0000", pathlib.Path("python"))
    new = releases.Release("HEAD", "81d9ede725220000", pathlib.Path("python"))
    first = run.Phase("every service on 0b8a9212", {"api-1": "0b8a9212", "relay-1": "0b8a9212"}, accepted=["p1", "p2"])
    rolled = run.Phase("relay: 1 new beside 1 old", {"api-1": "0b8a9212", "relay-2": "HEAD"}, accepted=["p3", "p4"])
    return run.Result(
        old=old,
        new=new,
        settings=run.FULL,
        phases=[first, rolled],
        outcomes={"p1": "SUCCEEDED", "p2": "FAILED", "p3": "CANCELED", "p4": "RUNNING"},
        held=held,
        findings=findings,
        seconds=1014.2,
    )


def test_a_rollout_is_kept_and_its_page_shows_each_mix_and_what_was_held(tmp_path: pathlib.Path) -> None:
    held = {"video-2": collections.Counter({"attempt handed back": 1}), "relay-1": collections.Counter()}
    report.write(_result([], held), tmp_path / "upgrade.md")
    page = (tmp_path / "upgrade.md").read_text()
    assert "{{" not in page and "{%" not in page
    assert "From 0b8a9212 (`0b8a9212659e`) to HEAD (`81d9ede72522`), " in page and "UTC, 1014 s, on " in page
    assert (
        "`make upgrade-test`: 2 replicas of every service, 45 s of traffic in each mix of releases at 2 brief/s" in page
    )
    assert "**No findings.**\n\n## Each mix of releases" in page
    assert "| every service on 0b8a9212 | api-1, relay-1 | - | 2 | 1 | 1 | 0 | 0 |" in page
    assert "| relay: 1 new beside 1 old | api-1 | relay-2 | 2 | 0 | 0 | 1 | 1 |" in page
    assert "| attempt handed back | 1 | video-2 |" in page and page.endswith("so that each leads its share.\n")
    kept = json.loads((tmp_path / "upgrade.json").read_text())
    assert report.render(kept) == page


def test_a_rollout_with_findings_and_nothing_held_says_so() -> None:
    measured = json.loads(json.dumps(report.measurements(_result(["p4: not ended", "a lost event"], {}))))
    page = report.render(measured)
    assert "**2 findings:**\n- p4: not ended\n- a lost event\n\n## Each" in page
    assert page.endswith(
        "## Held or handed back\n\nNothing: no process held an event or a job for the other release,"
        " none handed an attempt back.\n"
    )


def test_a_measurement_missing_from_the_kept_file_fails_the_page_instead_of_leaving_a_gap() -> None:
    measured = json.loads(json.dumps(report.measurements(_result([], {}))))
    del measured["settings"]["phase_s"]
    with pytest.raises(jinja2.UndefinedError):
        report.render(measured)
