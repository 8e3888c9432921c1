"""The fault report's chart (castad_faults.report).

Each fault on the run's clock, the same file for the same faults.
"""

from __future__ import annotations

import re

from castad_faults import outcome, report


def _faults(outage_s: float = 180.0) -> list[outcome.Fault]:
    return [
        outcome.Fault(kind="kill -9", target="lyric-1", started=1060.0, ended=1061.0, recovered_s=1.0),
        outcome.Fault(kind="database outage", target="api", started=1300.0, ended=1300.0 + outage_s, recovered_s=0.2),
        outcome.Fault(kind="postgresql failover", target="primary", started=2000.0, ended=2005.3, recovered_s=None),
    ]


def test_the_fault_chart_names_each_fault_in_order_with_how_long_it_lasted_and_when_work_resumed() -> None:
    svg = report.timeline(_faults(), started=1000.0)
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    named = [label for label in labels if label[:1].isdigit() and ": " in label]
    assert named == ["1 kill -9: lyric-1", "2 database outage: api", "3 postgresql failover: primary"]
    assert "1.0 s, recovered in 1.0 s" in labels
    assert "180.0 s, recovered in 0.2 s" in labels
    assert "5.3 s, recovered in —" in labels


def test_the_fault_chart_is_the_same_file_for_the_same_faults_and_follows_them() -> None:
    first = report.timeline(_faults(), started=1000.0)
    assert report.timeline(_faults(), started=1000.0) == first
    assert report.timeline(_faults(outage_s=60.0), started=1000.0) != first
