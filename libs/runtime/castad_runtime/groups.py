"""Group commit: what several threads hand in at about the same time, handled together in one transaction.

Each thread hands in its item and waits for it to be handled. The first thread to find no group under
way leads: it takes every item waiting (up to `max_items`) and handles them as one group, for the
others too; items handed in meanwhile wait for the next group, which one of their threads leads. A
lone item is a group of one, handled at once: nothing ever waits for company, so an idle service
loses no time, and a busy one commits once for many items.

A group that fails (an outage, a deadlock, one item that cannot be handled) is handled again item by
item, each in its own thread: every item then meets its own fate, and only the item at fault fails.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from castad_runtime import outages, redact

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclasses.dataclass(eq=False)
class _Entry(Generic[T, R]):
    item: T
    handled: bool = False  # by its group
    alone: bool = False  # its group failed: its own thread handles it alone
    result: R | None = None
    woken: threading.Event = dataclasses.field(default_factory=threading.Event)  # done, or handed the lead


class GroupCommit(Generic[T, R]):
    """Items handled in groups (see the module docstring).

    `handle_group(items)` handles several items at once (one transaction) and returns a result per item,
    in order; `handle_one(item)` handles a group of one (its leader's own item), and each item of a failed
    group. A thread is woken only when its item is done or when it is handed the lead.
    """

    def __init__(
        self,
        handle_group: Callable[[Sequence[T]], Sequence[R]],
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
        self._leading = False
        self._lock = threading.Lock()

    def submit(self, item: T) -> R:
        """Handle `item`, with whatever else is handed in meanwhile; its result, or its own error."""
        entry: _Entry[T, R] = _Entry(item)
        with self._lock:
            self._waiting.append(entry)
            leads, self._leading = not self._leading, True
        while True:
            if not leads:
                entry.woken.wait()
                entry.woken.clear()
            if entry.handled:
                return entry.result  # type: ignore[return-value]
            if entry.alone:
                return self._handle_one(item)
            with self._lock:  # this thread leads
                group = self._waiting[: self._max_items]
                del self._waiting[: self._max_items]
            if len(group) == 1 and group[0] is entry:  # alone: handled at once, items coming meanwhile wait
                try:
                    return self._handle_one(item)
                finally:
                    self._settle([], None)
            self._lead(group)
            leads = False  # its own item is settled, or the lead is handed on (to itself, if it comes first)

    def _lead(self, group: list[_Entry[T, R]]) -> None:
        results: Sequence[R] | None = None
        try:
            results = self._handle_group([entry.item for entry in group])
        except Exception as error:
            if outages.is_outage(error):
                log.info("%s of %d: outage (%s); each alone", self._name, len(group), redact.describe(error))
            else:
                log.warning("%s of %d failed: each alone", self._name, len(group), exc_info=True)
        finally:
            self._settle(group, results)

    def _settle(self, group: list[_Entry[T, R]], results: Sequence[R] | None) -> None:
        """The group is done (results None: each item alone, in its own thread); the lead goes to the first
        item waiting, if any."""
        with self._lock:
            for index, entry in enumerate(group):
                if results is None:
                    entry.alone = True
                else:
                    entry.result, entry.handled = results[index], True
                entry.woken.set()
            if self._waiting:
                self._waiting[0].woken.set()
            else:
                self._leading = False
