"""The benchmark's paired rounds (bench/paired.py).

Who runs first, the ratios taken within a round, and the round shown in detail.
"""

from __future__ import annotations

from typing import Any

import pytest
from castad_testkit import latency

from bench import paired


class Side:
    """A side whose figures are given per round: (pipelines/s, CPU ms per pipeline, idle p50 ms)."""

    def __init__(self, name: str, figures: list[tuple[float, float, float]], ran: list[str]) -> None:
        self.name = name
        self.figures = figures
        self.ran = ran
        self.rounds = 0

    def idle(self, count: int, warmup: int) -> dict[str, Any]:
        raise AssertionError("the detailed idle run is not part of a round")

    def throughput(self, count: int, concurrency: int, first: int, *, count_commits: bool) -> dict[str, Any]:
        self.ran.append(f"{self.name} throughput commits={count_commits}")
        rate, cpu, _ = self.figures[self.rounds]
        return {"rate": rate, "cpu_ms_per_pipeline": {"process": cpu / 2, "postgres": cpu / 2}}

    def idle_lot(self, count: int, first: int) -> latency.Summary:
        self.ran.append(f"{self.name} idle")
        p50 = self.figures[self.rounds][2]
        self.rounds += 1
        return latency.summary([p50])


def test_rounds_alternate_who_goes_first_and_count_no_commits() -> None:
    ran: list[str] = []
    sides = {
        "castad": Side("castad", [(40.0, 30.0, 40.0)] * 2, ran),
        "dbos": Side("dbos", [(50.0, 20.0, 20.0)] * 2, ran),
    }
    rounds = paired.run(sides, 2, pipelines=10, concurrency=2, idle=3, first=0)
    assert [r["order"] for r in rounds] == [["castad", "dbos"], ["dbos", "castad"]]
    assert ran == [
        "castad throughput commits=False",
        "dbos throughput commits=False",
        "castad idle",
        "dbos idle",
        "dbos throughput commits=False",
        "castad throughput commits=False",
        "dbos idle",
        "castad idle",
    ]


def test_ratios_are_taken_within_each_round_and_the_median_round_is_shown() -> None:
    # The host slows down from round to round; each round's ratio stays near the sides' true ratio.
    castad = [(40.0, 30.0, 40.0), (30.0, 40.0, 60.0), (20.0, 60.0, 80.0)]
    dbos = [(50.0, 20.0, 20.0), (40.0, 25.0, 25.0), (30.0, 40.0, 40.0)]
    sides = {"castad": Side("castad", castad, []), "dbos": Side("dbos", dbos, [])}
    rounds = paired.run(sides, 3, pipelines=10, concurrency=2, idle=3, first=0)
    ratios = paired.ratios(rounds)
    assert ratios["throughput"] == [0.8, 0.75, 20 / 30]
    assert ratios["cpu"] == [1.5, 1.6, 1.5]
    assert ratios["idle_e2e_p50"] == [2.0, 2.4, 2.0]
    assert paired.median_round(rounds) is rounds[1]  # throughput ratio 0.75, between 0.67 and 0.8


def test_one_side_shows_its_round_of_median_throughput_and_an_even_count_has_none() -> None:
    figures = [(40.0, 30.0, 40.0), (20.0, 60.0, 80.0), (30.0, 40.0, 60.0)]
    rounds = paired.run({"castad": Side("castad", figures, [])}, 3, pipelines=10, concurrency=2, idle=3, first=0)
    assert paired.median_round(rounds) is rounds[2]
    with pytest.raises(ValueError):
        paired.median_round(rounds[:2])
