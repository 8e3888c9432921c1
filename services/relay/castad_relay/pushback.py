"""Publishes the broker refused: a full queue, or a queue without a majority of its nodes.

A queue over its length limit refuses what is routed to it (reject-publish, `topology.Topology.limits_policy`) and
the broker nacks the publish; so does a quorum queue that lost its majority. Either way the refusal is the
destination's, not the row's: every row for that destination (its event type; a replay's queue) waits in its
outbox, uncharged, and after a pause one row alone is sent again, the probe. The pause doubles with each refusal in
a row, from the relay's retry delay up to MAX_S; a probe the broker takes releases the others.

Only the probe is sent while a destination refuses, because a refused publish still reached the other queues bound
to its type, which take it again when it is sent again (their inboxes drop the copy): one probe per pause keeps
those copies to a few, where sending every waiting row again would copy each of them each time.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable

from castad_runtime import backoff

log = logging.getLogger(__name__)

MAX_S = 10.0  # the longest pause between probes: a queue that has room again is used within it


@dataclasses.dataclass(frozen=True)
class PushedBack:
    """Not sent (or sent and nacked): its destination refuses publishes; it waits `wait_s`, uncharged."""

    destination: str
    wait_s: float
    sent: bool = False  # sent, and refused (nacked); or held unsent

    def reason(self) -> str:
        return (
            f"the broker refuses publishes to {self.destination} (a queue that takes it is full, or without a"
            " majority of its nodes); tried again in a moment"
        )


@dataclasses.dataclass
class _Refusals:
    count: int  # refusals in a row
    until: float  # when the next probe may go (the clock's seconds)
    probing: bool = False  # a probe is out


class PushBack:
    """The destinations that refuse publishes now, and when each is probed again."""

    def __init__(
        self, first_s: float, max_s: float = MAX_S, clock: Callable[[], float] = time.monotonic, seed: int | None = None
    ) -> None:
        self.first_s = first_s
        self.max_s = max(max_s, first_s)
        self._clock = clock
        self._rng = random.Random(seed)
        self._refusing: dict[str, _Refusals] = {}

    def hold(self, destination: str) -> PushedBack | None:
        """Whether a row for `destination` waits; None: send it (nothing refused there, or it is the probe)."""
        refusals = self._refusing.get(destination)
        if refusals is None:
            return None
        now = self._clock()
        if refusals.probing or now < refusals.until:  # rounded: the rows held in one round are held together
            return PushedBack(destination, round(max(refusals.until - now, self.first_s), 1))
        refusals.probing = True
        return None

    def refused(self, destination: str) -> PushedBack:
        """The broker nacked a publish to `destination`: it and every row for it wait."""
        now = self._clock()
        refusals = self._refusing.get(destination)
        if refusals is not None and not refusals.probing and now < refusals.until:
            return PushedBack(destination, round(refusals.until - now, 1), sent=True)  # one beside it was refused first
        count = refusals.count + 1 if refusals is not None else 1
        wait_s = backoff.exponential_s(count - 1, self.first_s, self.max_s, jitter=0.2, rng=self._rng)
        self._refusing[destination] = _Refusals(count, now + wait_s)
        if count == 1:
            log.warning(
                "the broker refuses publishes to %s (a queue that takes it is full, or without a majority of its"
                " nodes): its events wait in their outboxes, one probing every %g s at most",
                destination,
                self.max_s,
            )
        return PushedBack(destination, wait_s, sent=True)

    def taken(self, destination: str) -> None:
        """The broker took a publish to `destination`: its rows go again."""
        refusals = self._refusing.pop(destination, None)
        if refusals is not None:
            log.info("the broker takes publishes to %s again, after %d refusals", destination, refusals.count)

    def lost(self, destination: str) -> None:
        """The probe to `destination` got no answer (other trouble, or the row's own): another row may probe."""
        refusals = self._refusing.get(destination)
        if refusals is not None:
            refusals.probing = False
