"""What a fault run found: each fault injected, the run's result, and the figures the fault report gives of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from castad_testkit import latency

from castad_faults import checker, injections, plan, traffic

# The target for pipelines no fault touches, while a row is parked: a speed target the report states as met or
# missed, not a finding (the time it takes follows the machine's speed, which the promise does not).
HANDOFF_P99_MS = 50.0
NODE_LOSS = (
    "rabbitmq node killed",
    "rabbitmq node stopped",
    "rabbitmq node cut off",
    "relay leader frozen",
    "stage replica frozen",
)
FAILOVER = "postgresql failover"
STANDBY_LOSS = "postgresql standby lost"
FROZEN_IN_TRANSACTION = "frozen inside a transaction"


@dataclasses.dataclass
class Fault:
    kind: str
    target: str
    started: float
    ended: float = 0.0
    detail: str = ""
    recovered_s: float | None = None
    # The loss of a node: how soon another replica, node or host took over, and against what bound;
    # the longest pause of all work meanwhile; events the inboxes dropped as seen before.
    takeover_s: float | None = None
    takeover_bound_s: float | None = None
    paused_s: float | None = None
    duplicates: float | None = None
    submissions: str = ""


@dataclasses.dataclass
class Result:
    plan: plan.Plan
    started: float
    finished: float
    accepted: list[traffic.Accepted]
    quiet: list[traffic.Accepted]
    refusals: dict[str, int]
    faults: list[Fault]
    findings: list[str]
    snapshot: checker.Snapshot
    handoffs_ms: dict[str, latency.Summary]
    duplicates: int
    dropped: float  # events the inboxes dropped as seen before, over the whole run
    provider_tasks: int  # songs the music API was asked for, by its own count
    recorded_submissions: int  # submissions the song stage recorded before they left
    poison: list[injections.Poison]
    probes: list[str]  # outbox rows added for the relay to park
    actions: list[traffic.Action]

    @property
    def last_fault_end(self) -> float:
        """When the last fault (the failover) ended, on the databases' clock: what the pipelines' ends compare to."""
        return on_the_databases_clock(max(fault.ended for fault in self.faults))

    @property
    def handoff_p99_ms(self) -> float | None:
        """None: not measured (a plan without a quiet phase)."""
        summary = self.handoffs_ms.get("stage handoff")
        return None if summary is None else summary["p99"]

    @property
    def handoff_target_met(self) -> bool | None:
        p99 = self.handoff_p99_ms
        return None if p99 is None else p99 <= HANDOFF_P99_MS


def on_the_databases_clock(moment: float) -> float:
    """A moment after the failover as the databases stamp it: the promoted primary's clock is ahead of this one's."""
    return moment + plan.STANDBY_CLOCK_AHEAD_S


def summarize(result: Result) -> dict[str, Any]:
    """The figures the fault report gives."""
    pipelines = result.snapshot.pipelines
    outcomes: dict[str, int] = {}
    for row in pipelines.values():
        key = row["status"] if row["status"] == "SUCCEEDED" else f"{row['status']} ({row['error_code']})"
        outcomes[key] = outcomes.get(key, 0) + 1
    ended = [row for row in pipelines.values() if row["finished_at"]]
    to_terminal = [(row["finished_at"] - row["created_at"]).total_seconds() for row in ended]
    last_retry = checker.last_retries(result.snapshot)
    after_faults = [
        checker.lateness(pipeline_id, row, last_retry, result.last_fault_end)
        for pipeline_id, row in pipelines.items()
        if row["finished_at"]
    ]
    return {
        "outcomes": dict(sorted(outcomes.items())),
        "longest_to_terminal_s": max(to_terminal, default=float("nan")),
        "median_to_terminal_s": latency.percentile(to_terminal, 50),
        "p90_to_terminal_s": latency.percentile(to_terminal, 90),
        "longest_after_last_fault_s": max(after_faults, default=float("nan")),
        "attempts": {
            stage: dict(counter.most_common()) for stage, counter in checker.attempt_outcomes(result.snapshot).items()
        },
        "submissions": checker.submissions(result.snapshot, "song", result.started, result.finished),
    }


def kinds(faults: Iterable[Fault]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for fault in faults:
        counted[fault.kind] = counted.get(fault.kind, 0) + 1
    return counted
