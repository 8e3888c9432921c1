"""A and D side by side: Castad and DBOS both up, measured in alternating rounds.

This machine's speed drifts within minutes (a shared host: the same Castad code used 34 ms of CPU
a pipeline in one throughput run and 61 ms in another about twenty minutes later), so two parts
run one after the other can set a fast stretch against a slow one, and their ratio then says more
about the host than about either. Here both installations run at once. Each round runs a
throughput run of each, then an idle lot of each (pipelines one at a time, end to end from the
databases), who goes first alternating from round to round; a ratio to DBOS's is taken within
each round, and a target stands on the median of those ratios. The other installation only idles
meanwhile (its schedulers' polls, DBOS's queue thread).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from castad_testkit import latency, scratch

T = TypeVar("T")


class Side(Protocol):
    def idle(self, count: int, warmup: int) -> dict[str, Any]: ...
    def throughput(self, count: int, concurrency: int, first: int, *, count_commits: bool) -> dict[str, Any]: ...
    def idle_lot(self, count: int, first: int) -> latency.Summary: ...


def run(sides: Mapping[str, Side], rounds: int, pipelines: int, concurrency: int, idle: int, first: int) -> list[Any]:
    """`rounds` rounds over `sides` (name -> side).

    Each round's figures by side, and the order they ran in. No round counts commits: that waits about 45 s for
    PostgreSQL's statistics before and after a run, which would set the two sides' runs of a round far apart (count
    them in a run before the rounds).
    """
    done: list[dict[str, Any]] = []
    for number in range(rounds):
        order = list(sides) if number % 2 == 0 else list(sides)[::-1]
        measured: dict[str, dict[str, Any]] = {name: {} for name in order}
        for name in order:
            measured[name]["throughput"] = sides[name].throughput(pipelines, concurrency, first, count_commits=False)
            first += pipelines
        for name in order:
            measured[name]["idle_e2e_ms"] = sides[name].idle_lot(idle, first)
            first += idle
        done.append({"order": order, **measured})
        scratch.log.info(
            "round %d: %s",
            number + 1,
            "; ".join(
                f"{name} {m['throughput']['rate']:.1f}/s, {cpu_ms(m['throughput']):.1f} ms CPU, "
                f"idle p50 {m['idle_e2e_ms']['p50']:.1f} ms"
                for name, m in measured.items()
            ),
        )
    return done


def cpu_ms(throughput: dict[str, Any]) -> float:
    """CPU per pipeline of every process of a throughput run, PostgreSQL's included."""
    return float(sum(throughput["cpu_ms_per_pipeline"].values()))


def ratios(rounds: list[dict[str, Any]], side: str = "castad", peer: str = "dbos") -> dict[str, list[float]]:
    """Per round, `side`'s figure over `peer`'s: throughput, CPU per pipeline, idle end to end p50."""
    return {
        "throughput": [r[side]["throughput"]["rate"] / r[peer]["throughput"]["rate"] for r in rounds],
        "cpu": [cpu_ms(r[side]["throughput"]) / cpu_ms(r[peer]["throughput"]) for r in rounds],
        "idle_e2e_p50": [r[side]["idle_e2e_ms"]["p50"] / r[peer]["idle_e2e_ms"]["p50"] for r in rounds],
    }


def median_of(items: Sequence[T], key: Callable[[T], float]) -> T:
    """Of an odd number of items, the one whose `key` is the median: a real item, to be shown in detail."""
    if len(items) % 2 == 0:
        raise ValueError("an odd number of rounds has a median round")
    return sorted(items, key=key)[len(items) // 2]


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round the report shows in detail.

    Of an odd number of rounds, the one whose throughput ratio is the median (of one side's rounds, the one of
    median throughput).
    """
    (one, *others) = rounds[0]["order"]
    keys = ratios(rounds)["throughput"] if others else [r[one]["throughput"]["rate"] for r in rounds]
    return rounds[median_of(range(len(rounds)), keys.__getitem__)]
