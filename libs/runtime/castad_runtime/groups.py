"""Group commit: what several threads hand in at about the same time, handled together in one transaction.

Each thread hands in its item and waits for it to be handled. A thread that finds fewer than
`max_groups` groups under way leads: it handles the items waiting (up to `max_items`) as one group,
for the others too; items handed in meanwhile wait for the next group, which one of their threads
leads. A lone item is a group of one, handled at once: nothing ever waits for company, so an idle
service loses no time, and a busy one commits once for many items. Items that share a `key` are
never in two groups under way at once.

A group that fails (an outage, a deadlock, one item that cannot be handled) is handled again item by
item, each in its own thread: every item then meets its own fate, and only the item at fault fails.
A group may also leave some of its items to their own threads (`ALONE`), say those it could not take
without waiting for another transaction.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from castad_runtime import outages, redact

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class Left(enum.Enum):
    ALONE = "alone"


ALONE = Left.ALONE  # a group's result for an item it leaves to its own thread (handle_one there)


@dataclasses.dataclass(eq=False)
class _Entry(Generic[T, R]):
    item: T
    handled: bool = False  # by its group
    alone: bool = False  # its own thread handles it (its group failed, or left it)
    result: R | None = None
    group: list[_Entry[T, R]] | None = None  # the group its thread was handed to lead (itself first), until done
    woken: threading.Event = dataclasses.field(default_factory=threading.Event)  # done, or handed a group


class GroupCommit(Generic[T, R]):
    """Items handled in groups (see the module docstring).

    `handle_group(items)` handles several items at once (one transaction) and returns a result per item, in
    order, or ALONE for an item it leaves; `handle_one(item)` handles a group of one (its leader's own item),
    and each item left alone. A thread is woken only when its item is done or when it is handed a group to lead.

    `max_groups` groups may be under way at once (a lone item counts as one), each led by the thread of its
    first item: while one waits for the database, the next one is made and sent. Items of the same `key` (say,
    a pipeline's events) are never in two groups under way at once: such an item waits for the group that
    has its key to end, so items of one key are handled in the order they were handed in.
    """

    def __init__(
        self,
        handle_group: Callable[[Sequence[T]], Sequence[R | Left]],
        handle_one: Callable[[T], R],
        max_items: int = 32,
        name: str = "group",
        *,
        max_groups: int = 1,
        key: Callable[[T], Hashable] | None = None,
    ) -> None:
        if max_items < 1 or max_groups < 1:
            raise ValueError("max_items and max_groups must be at least 1")
        self._handle_group = handle_group
        self._handle_one = handle_one
        self._max_items = max_items
        self._max_groups = max_groups
        self._key = key
        self._name = name
        self._waiting: list[_Entry[T, R]] = []
        self._groups = 0  # groups under way, or handed to a thread to lead
        self._busy: collections.Counter[Hashable] = collections.Counter()  # keys of the items in those groups
        self._lock = threading.Lock()

    def submit(self, item: T) -> R:
        """Handle `item`, with whatever else is handed in meanwhile; its result, or its own error."""
        entry: _Entry[T, R] = _Entry(item)
        with self._lock:
            self._waiting.append(entry)
            self._hand_on()
        try:
            while True:
                entry.woken.wait()
                entry.woken.clear()
                if entry.handled:
                    return entry.result  # type: ignore[return-value]
                if entry.alone:
                    break
                group = entry.group  # this thread leads: its own item comes first
                assert group is not None
                if len(group) == 1:  # alone: handled at once, items coming meanwhile wait
                    try:
                        return self._handle_one(item)
                    finally:
                        self._settle(group, None, lone=True)
                results: Sequence[R | Left] | None = None
                try:
                    results = self._handled(group)
                finally:
                    self._settle(group, results)
        except BaseException:
            self._abandon(entry)
            raise
        return self._handle_one(item)

    def _handled(self, group: list[_Entry[T, R]]) -> Sequence[R | Left] | None:
        """The group's results; None if it failed (each item alone then)."""
        try:
            results = self._handle_group([entry.item for entry in group])
            if len(results) != len(group):
                raise ValueError(f"{len(results)} results for a group of {len(group)}")
        except Exception as error:
            if outages.is_outage(error):
                log.info("%s of %d: outage (%s); each alone", self._name, len(group), redact.describe(error))
            else:
                log.warning("%s of %d failed: each alone", self._name, len(group), exc_info=True)
            return None
        return results

    def _settle(self, group: list[_Entry[T, R]], results: Sequence[R | Left] | None, lone: bool = False) -> None:
        """Settle a group that is done, and make the next groups of the items waiting that may go.

        Results None: each item alone, in its own thread; `lone`: its leader's own item, whose thread has its
        result already.
        """
        with self._lock:
            for index, entry in enumerate(group if not lone else ()):
                result = ALONE if results is None else results[index]
                if result is ALONE:
                    entry.alone = True
                else:
                    entry.result, entry.handled = result, True
                entry.woken.set()
            self._end(group)
            self._hand_on()

    def _end(self, group: list[_Entry[T, R]]) -> None:
        """A group is no longer under way (with the lock held)."""
        group[0].group = None
        self._groups -= 1
        if self._key is not None:
            self._busy.subtract(self._key(entry.item) for entry in group)
            self._busy = +self._busy  # drop the keys no group has any more

    def _hand_on(self) -> None:
        """Start the next groups while fewer than `max_groups` are under way (with the lock held).

        Each group is made of the items waiting that may go, and handed to its first item's thread to lead.
        """
        while self._waiting and self._groups < self._max_groups:
            group = self._next_group()
            if not group:  # every item waiting has a key that a group under way has
                return
            self._groups += 1
            if self._key is not None:
                self._busy.update(self._key(entry.item) for entry in group)
            group[0].group = group
            group[0].woken.set()

    def _next_group(self) -> list[_Entry[T, R]]:
        """Up to `max_items` of the items waiting, in order, but those whose key a group under way has.

        Taken off the waiting list (with the lock held).
        """
        group: list[_Entry[T, R]] = []
        left: list[_Entry[T, R]] = []
        for entry in self._waiting:
            if len(group) < self._max_items and (self._key is None or self._key(entry.item) not in self._busy):
                group.append(entry)
            else:
                left.append(entry)
        self._waiting = left
        return group

    def _abandon(self, entry: _Entry[T, R]) -> None:
        """A thread that leaves early (an exception it did not raise itself, while it waited or led).

        Its item is no longer waiting, and a group it was handed but did not lead goes back, first in line, for
        another thread to lead.
        """
        with self._lock:
            if entry in self._waiting:
                self._waiting.remove(entry)
            group = entry.group
            if group is not None:
                self._end(group)
                self._waiting[:0] = [other for other in group if other is not entry]
                self._hand_on()
