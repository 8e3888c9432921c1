"""Group commit (castad_runtime.groups): items handed in together are handled together, each gets its own result."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from castad_runtime import groups

from tests.support import waits


class Recorder:
    """handle_group and handle_one that record their calls; `gate` holds handle_one until set."""

    def __init__(
        self, failing: frozenset[str] = frozenset(), group_fails: bool = False, left: frozenset[str] = frozenset()
    ) -> None:
        self.left = left  # what a group leaves to each item's own thread
        self.groups: list[list[str]] = []
        self.ones: list[str] = []
        self.failing = failing
        self.group_fails = group_fails
        self.gate = threading.Event()
        self.gate.set()
        self.holding = threading.Event()  # handle_one is waiting at the gate

    def group(self, items: Sequence[str]) -> list[str | groups.Left]:
        self.groups.append(list(items))
        if self.group_fails:
            raise ValueError("the group cannot be handled")
        return [groups.ALONE if item in self.left else f"{item} done together" for item in items]

    def one(self, item: str) -> str:
        self.ones.append(item)
        self.holding.set()
        self.gate.wait(10)
        if item in self.failing:
            raise ValueError(f"{item} cannot be handled")
        return f"{item} done"


def submit_all(commit: groups.GroupCommit[str, str], items: list[str], queued: bool = True) -> dict[str, Any]:
    """Each item handed in from a thread of its own.

    If `queued` (another item is being handled), each started once the one before it waits.
    """
    outcomes: dict[str, Any] = {}

    def submit(item: str) -> None:
        try:
            outcomes[item] = commit.submit(item)
        except BaseException as error:  # an Interrupted too
            outcomes[item] = error

    threads = []
    for number, item in enumerate(items, 1):
        threads.append(threading.Thread(target=submit, args=(item,)))
        threads[-1].start()
        if queued:
            waits.until(lambda: len(commit._waiting) >= number, timeout_s=5, interval_s=0.001, what=f"{item} waiting")  # noqa: B023
    return {"threads": threads, "outcomes": outcomes}


def joined(started: dict[str, Any]) -> dict[str, Any]:
    for thread in started["threads"]:
        thread.join(10)
    return started["outcomes"]


def behind_a(
    commit: groups.GroupCommit[str, str],
    recorder: Recorder,
    items: list[str],
    meanwhile: Callable[[dict[str, Any]], None] = lambda started: None,
) -> dict[str, Any]:
    """`items` handed in while "a", alone, is being handled (held at the recorder's gate); what each got."""
    recorder.gate.clear()
    first = submit_all(commit, ["a"], queued=False)
    recorder.holding.wait(5)
    rest = submit_all(commit, items)
    meanwhile(rest)
    recorder.gate.set()
    assert joined(first) == {"a": "a done"}
    return joined(rest)


def test_a_lone_item_is_handled_at_once_by_itself():
    recorder = Recorder()
    commit = groups.GroupCommit(recorder.group, recorder.one)
    assert commit.submit("a") == "a done"
    assert (recorder.ones, recorder.groups) == (["a"], [])


def test_items_handed_in_while_one_is_handled_are_handled_together_next():
    recorder = Recorder()
    commit = groups.GroupCommit(recorder.group, recorder.one)
    outcomes = behind_a(commit, recorder, ["b", "c", "d"])
    assert outcomes == {item: f"{item} done together" for item in "bcd"}
    assert (recorder.ones, recorder.groups) == (["a"], [["b", "c", "d"]])


def test_a_group_takes_at_most_max_items_and_the_rest_follow():
    recorder = Recorder()
    commit = groups.GroupCommit(recorder.group, recorder.one, max_items=2)
    outcomes = behind_a(commit, recorder, ["b", "c", "d", "e"])
    assert outcomes == {item: f"{item} done together" for item in "bcde"}
    assert recorder.groups == [["b", "c"], ["d", "e"]]


def test_a_failed_group_is_handled_item_by_item_and_only_the_item_at_fault_fails():
    recorder = Recorder(failing=frozenset({"c"}), group_fails=True)
    commit = groups.GroupCommit(recorder.group, recorder.one)
    outcomes = behind_a(commit, recorder, ["b", "c", "d"])
    assert recorder.groups == [["b", "c", "d"]]
    assert sorted(recorder.ones) == ["a", "b", "c", "d"]
    assert (outcomes["b"], outcomes["d"]) == ("b done", "d done")
    assert isinstance(outcomes["c"], ValueError) and "c cannot" in str(outcomes["c"])


def test_the_error_of_a_lone_item_is_raised_in_its_thread_and_the_next_item_goes_on():
    recorder = Recorder(failing=frozenset({"a"}))
    commit = groups.GroupCommit(recorder.group, recorder.one)
    with pytest.raises(ValueError, match="a cannot"):
        commit.submit("a")
    assert commit.submit("b") == "b done"


def test_max_items_must_be_positive():
    with pytest.raises(ValueError):
        groups.GroupCommit(len, len, max_items=0)


def test_an_item_its_group_leaves_alone_is_handled_in_its_own_thread():
    recorder = Recorder(left=frozenset({"c"}))
    commit = groups.GroupCommit(recorder.group, recorder.one)
    outcomes = behind_a(commit, recorder, ["b", "c", "d"])
    assert outcomes == {"b": "b done together", "c": "c done", "d": "d done together"}
    assert sorted(recorder.ones) == ["a", "c"]


def test_a_group_answering_for_fewer_items_than_it_had_is_handled_item_by_item():
    recorder = Recorder()
    commit = groups.GroupCommit(lambda items: recorder.group(items)[:-1], recorder.one)
    outcomes = behind_a(commit, recorder, ["b", "c"])
    assert outcomes == {"b": "b done", "c": "c done"}


class Interrupted(BaseException):
    """Raised in a thread from outside it, as Dramatiq's time limit does."""


def test_a_thread_interrupted_while_it_waits_passes_on_the_lead_it_was_handed():
    recorder = Recorder()
    commit = groups.GroupCommit(recorder.group, recorder.one)

    def interrupt_b(started: dict[str, Any]) -> None:  # "b" is the next to lead; interrupted as it wakes
        b = started["threads"][0]
        assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(b.ident), ctypes.py_object(Interrupted))

    outcomes = behind_a(commit, recorder, ["b", "c"], interrupt_b)
    assert isinstance(outcomes["b"], Interrupted)
    assert outcomes["c"] == "c done"  # led by its own thread, once b's passed the lead on


class Gates:
    """handle_one and handle_group that hold each item at a gate of its own until it is opened."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.started: list[list[str]] = []  # each call's items, in the order the calls began
        self._lock = threading.Lock()

    def gate(self, item: str) -> threading.Event:
        with self._lock:
            return self.gates.setdefault(item, threading.Event())

    def one(self, item: str) -> str:
        self.started.append([item])
        self.gate(item).wait(10)
        return f"{item} done"

    def group(self, items: Sequence[str]) -> list[str]:
        self.started.append(list(items))
        for item in items:
            self.gate(item).wait(10)
        return [f"{item} done together" for item in items]


def test_with_two_groups_under_way_an_item_goes_at_once_while_another_is_handled():
    gates = Gates()
    commit = groups.GroupCommit(gates.group, gates.one, max_groups=2)
    first = submit_all(commit, ["a"], queued=False)
    waits.until(lambda: gates.started == [["a"]], timeout_s=5, interval_s=0.001, what="a under way")
    second = submit_all(commit, ["b"], queued=False)
    waits.until(lambda: gates.started == [["a"], ["b"]], timeout_s=5, interval_s=0.001, what="b under way beside a")
    third = submit_all(commit, ["c", "d"])  # both slots taken: these wait, then go together
    gates.gate("b").set()
    assert joined(second) == {"b": "b done"}
    waits.until(lambda: len(gates.started) == 3, timeout_s=5, interval_s=0.001, what="c and d under way")
    assert gates.started[2] == ["c", "d"]
    for item in "acd":
        gates.gate(item).set()
    assert joined(first) == {"a": "a done"}
    assert joined(third) == {"c": "c done together", "d": "d done together"}


def test_an_item_whose_key_a_group_under_way_has_waits_for_it_and_others_go_past():
    gates = Gates()
    commit = groups.GroupCommit(gates.group, gates.one, max_groups=2, key=lambda item: item[0])
    first = submit_all(commit, ["p1"], queued=False)
    waits.until(lambda: gates.started == [["p1"]], timeout_s=5, interval_s=0.001, what="p1 under way")
    later = submit_all(commit, ["p2", "p3"])  # a slot is free, but their key is under way
    time.sleep(0.05)
    assert gates.started == [["p1"]]
    other = submit_all(commit, ["q1"], queued=False)  # another key takes the free slot, past them
    waits.until(lambda: gates.started == [["p1"], ["q1"]], timeout_s=5, interval_s=0.001, what="q1 under way beside p1")
    gates.gate("q1").set()
    assert joined(other) == {"q1": "q1 done"}
    assert gates.started == [["p1"], ["q1"]]  # still waiting for p1
    for item in ("p1", "p2", "p3"):
        gates.gate(item).set()
    assert joined(first) == {"p1": "p1 done"}
    assert joined(later) == {"p2": "p2 done together", "p3": "p3 done together"}  # in the order handed in
    assert gates.started[2] == ["p2", "p3"]


def test_a_group_leaves_an_item_whose_key_is_under_way_waiting_in_its_place():
    gates = Gates()
    commit = groups.GroupCommit(gates.group, gates.one, max_groups=2, key=lambda item: item[0])
    first = submit_all(commit, ["p1"], queued=False)
    waits.until(lambda: gates.started == [["p1"]], timeout_s=5, interval_s=0.001, what="p1 under way")
    blocker = submit_all(commit, ["r1"], queued=False)
    waits.until(lambda: gates.started == [["p1"], ["r1"]], timeout_s=5, interval_s=0.001, what="r1 under way")
    waiting = submit_all(commit, ["p2", "q1", "q2"])  # both slots taken
    gates.gate("r1").set()  # a slot frees: q1 and q2 go together; p2 still waits for p1
    assert joined(blocker) == {"r1": "r1 done"}
    waits.until(lambda: len(gates.started) == 3, timeout_s=5, interval_s=0.001, what="the q group under way")
    assert gates.started[2] == ["q1", "q2"]
    for item in ("q1", "q2", "p1", "p2"):
        gates.gate(item).set()
    assert joined(first) == {"p1": "p1 done"}
    assert joined(waiting) == {"p2": "p2 done", "q1": "q1 done together", "q2": "q2 done together"}
    assert gates.started[3] == ["p2"]


def test_max_groups_must_be_positive():
    with pytest.raises(ValueError):
        groups.GroupCommit(len, len, max_groups=0)
