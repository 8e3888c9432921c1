"""Group commit: what several threads hand in at about the same time, handled together in one transaction.

Each thread hands in its item and waits for it to be handled. The first thread to find no group under
way leads: it takes every item waiting (up to `max_items`) and handles them as one group, for the
others too; items handed in meanwhile wait for the next group, which one of their threads leads. A
lone item is a group of one, handled at once: nothing ever waits for company, so an idle service
loses no time, and a busy one commits once for many items.

A group that fails (an outage, a deadlock, one item that cannot be handled) is handled again item by
item, each in its own thread: every item then meets its own fate, and only the item at fault fails.
A group may also leave some of its items to their own threads (`ALONE`), say those it could not take
without waiting for another transaction.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
from collections.abc import Callable, Sequence
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
    woken: threading.Event = dataclasses.field(default_factory=threading.Event)  # done, or handed the lead


class GroupCommit(Generic[T, R]):
    """Items handled in groups (see the module docstring).

    `handle_group(items)` handles several items at once (one transaction) and returns a result per item, in
    order, or ALONE for an item it leaves; `handle_one(item)` handles a group of one (its leader's own item),
    and each item left alone. A thread is woken only when its item is done or when it is handed the lead.
    """

    def __init__(
        self,
        handle_group: Callable[[Sequence[T]], Sequence[R | Left]],
        handle_one: Callable[[T], R],
        max_items: int = 32,
        name: str = "group",
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self._handle_group = handle_group
        self._handle_one = handle_one
        self._max_items = max_items
        self._name = name
        self._waiting: list[_Entry[T, R]] = []
        self._leader: _Entry[T, R] | None = None  # the entry whose thread leads or is handed the lead
        self._lock = threading.Lock()

    def submit(self, item: T) -> R:
        """Handle `item`, with whatever else is handed in meanwhile; its result, or its own error."""
        entry: _Entry[T, R] = _Entry(item)
        with self._lock:
            self._waiting.append(entry)
            if self._leader is None:
                self._leader = entry
                entry.woken.set()
        try:
            while True:
                entry.woken.wait()
                entry.woken.clear()
                if entry.handled:
                    return entry.result  # type: ignore[return-value]
                if entry.alone:
                    break
                group: list[_Entry[T, R]] = []
                results: Sequence[R | Left] | None = None
                try:
                    with self._lock:  # this thread leads: its own item comes first
                        group = self._waiting[: self._max_items]
                        del self._waiting[: self._max_items]
                    if len(group) == 1 and group[0] is entry:  # alone: handled at once, items coming meanwhile wait
                        group = []
                        return self._handle_one(item)
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

    def _settle(self, group: list[_Entry[T, R]], results: Sequence[R | Left] | None) -> None:
        """The group is done (results None: each item alone, in its own thread); the lead goes to the first
        item waiting, if any."""
        with self._lock:
            for index, entry in enumerate(group):
                result = ALONE if results is None else results[index]
                if result is ALONE:
                    entry.alone = True
                else:
                    entry.result, entry.handled = result, True
                entry.woken.set()
            self._hand_on()

    def _hand_on(self) -> None:
        """The lead to the first item waiting, or to none (with the lock held)."""
        self._leader = self._waiting[0] if self._waiting else None
        if self._leader is not None:
            self._leader.woken.set()

    def _abandon(self, entry: _Entry[T, R]) -> None:
        """A thread that leaves early (an exception it did not raise itself, while it waited or led): its item
        is no longer waiting, and a lead it held or was handed goes on."""
        with self._lock:
            if entry in self._waiting:
                self._waiting.remove(entry)
            if self._leader is entry:
                self._hand_on()
