"""Each service deletes its own rows and files once they outlived their retention, a small batch at a time.

A `Pruner` is a thread of the service that runs its `Step`s every `interval_s` (give or take a
tenth, so that replicas spread out). A step deletes at most about `batch` rows in one transaction
of its own (`transaction`: a short lock timeout and statement timeout), choosing them with
`FOR UPDATE SKIP LOCKED`: it never waits on a row a running transaction holds (that row waits for
the next round) and holds the rows it takes only for the moment of the delete. Batches go on while
they come back full, with a pause between two, so that the service's own work goes first. Several
replicas share the work. An outage ends a round early; the next one picks up where it stopped.

While a backlog lasts the batches grow: a full batch quicker than QUICK_S doubles the next, up to
MAX_BATCH rows, and a slower one halves it; the pause after a batch is `pause_s`, or longer, so that
deleting takes at most BUSY_SHARE of the pruner's time. Before, every batch was `batch` rows followed by
`pause_s`, which capped a pruner at 2,500 rows a second (500 rows, 0.2 s) though a batch of 500 takes
a few milliseconds: docs/reports/retention.md measured 2,365 rows a second before and 10,029 (outbox)
and 22,283 (inbox) now, two writers beside it inserting as fast as without it. At the capacity model's
5,000 pipelines a second the gateway's database writes about 70,000 outbox, inbox and timeline rows a
second, the stages' 15,000 each: several pruners' worth on one server, well under one where that model
splits each database over servers for its commits. So these tables are not partitioned: a partition
dropped whole would save the DELETE and its VACUUM, but the outbox's and the inbox's event_id could
then be unique only within a partition (a primary key must include the partition key), which the
inbox's dedupe relies on, and four databases would have to make and drop partitions on time.

What each service deletes is its own business (the outbox and inbox here, `shared_steps`; a
stage's jobs and files in castad_runtime.stage.retention; the gateway's in castad_api.retention).
Nothing unfinished is ever deleted: every step's statement names the finished state it deletes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import sqlalchemy as sa

from castad_runtime import backoff, db, inbox, metrics, outages, outbox, redact, settings

log = logging.getLogger(__name__)
MAX_BATCH = 10_000  # rows of one batch at most, however long a backlog
QUICK_S = 0.25  # a full batch that took less doubles the next one; a batch that took more halves it
BUSY_SHARE = 0.2  # of its time, retention spends at most this deleting: the pause after a batch is the rest
LOCK_TIMEOUT = "500ms"  # a backstop: rows are skipped when locked, this bounds any other wait (a migration's lock)
STATEMENT_TIMEOUT = "30s"


@dataclasses.dataclass(frozen=True)
class Step:
    """One kind of thing a service deletes.

    `remove(limit)` deletes up to `limit` of them, committed, and says how many; `rows_each` is about how many rows
    one spans (a job and its attempts), so that a batch of `batch // rows_each` of them stays near `batch` rows.
    """

    what: str
    remove: Callable[[int], int]
    rows_each: int = 1


@contextlib.contextmanager
def transaction(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A transaction of retention: it waits at most LOCK_TIMEOUT for a lock and runs at most STATEMENT_TIMEOUT."""
    with db.transaction(engine) as conn:
        conn.execute(
            sa.select(
                sa.func.set_config("lock_timeout", LOCK_TIMEOUT, True),
                sa.func.set_config("statement_timeout", STATEMENT_TIMEOUT, True),
            )
        )
        yield conn


def statement_step(
    what: str, engine: sa.Engine, delete: Callable[[sa.Connection, int], int], rows_each: int = 1
) -> Step:
    """A step whose every batch is one `delete(conn, limit)` in a retention transaction."""

    def remove(limit: int) -> int:
        with transaction(engine) as conn:
            return delete(conn, limit)

    return Step(what, remove, rows_each)


def shared_steps(engine: sa.Engine, config: settings.CommonSettings) -> list[Step]:
    """What every service with an outbox and an inbox deletes: published and long-parked outbox rows, handled ids."""
    return [
        statement_step(
            "published outbox rows",
            engine,
            lambda conn, limit: outbox.forget_published(conn, config.retention_outbox_s, limit),
        ),
        statement_step(
            "parked outbox rows and those held behind them",
            engine,
            lambda conn, limit: outbox.forget_parked(conn, config.retention_parked_s, limit),
        ),
        statement_step(
            "handled event ids", engine, lambda conn, limit: inbox.forget(conn, config.retention_inbox_s, limit)
        ),
    ]


class Pruner:
    """The service's thread that runs its retention steps every `interval_s`."""

    def __init__(
        self,
        steps: Sequence[Step],
        *,
        interval_s: float,
        batch: int,
        pause_s: float,
        max_batch: int = MAX_BATCH,
        quick_s: float = QUICK_S,
        busy_share: float = BUSY_SHARE,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        measured: metrics.RetentionMetrics | None = None,
    ) -> None:
        if interval_s <= 0 or batch < 1 or pause_s < 0 or quick_s <= 0 or not 0 < busy_share <= 1:
            raise ValueError("interval_s and quick_s must be > 0, batch >= 1, pause_s >= 0, 0 < busy_share <= 1")
        self.steps = list(steps)
        self.interval_s = interval_s
        self.batch = batch
        self.max_batch = max(batch, max_batch)
        self.pause_s = pause_s
        self.quick_s = quick_s
        self.busy_share = busy_share
        self._clock = clock
        self.measured = measured
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="retention", daemon=True)

    @classmethod
    def of(
        cls, steps: Sequence[Step], config: settings.CommonSettings, measured: metrics.RetentionMetrics | None = None
    ) -> Pruner:
        return cls(
            steps,
            interval_s=config.retention_interval_s,
            batch=config.retention_batch,
            pause_s=config.retention_pause_s,
            measured=measured,
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the batch under way (one short transaction, or one batch of file deletions)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def threads(self) -> list[threading.Thread]:
        """The pruner's thread, once started (for the liveness probe)."""
        return [self._thread] if self._thread.ident is not None else []

    def run_once(self) -> dict[str, int]:
        """One round: every step, batch after batch until one comes back short. What each removed.

        Each step starts at `batch` rows; a full batch that took less than `quick_s` doubles the next one, up to
        `max_batch` rows, and one that took longer halves it, down to `batch` again. After each full batch it
        pauses `pause_s`, or longer: so long that deleting took at most `busy_share` of the time.
        """
        removed = {}
        for step in self.steps:
            least, most = max(1, self.batch // step.rows_each), max(1, self.max_batch // step.rows_each)
            limit = least
            removed[step.what] = 0
            while not self._stop.is_set():
                started = self._clock()
                done = step.remove(limit)
                took_s = self._clock() - started
                removed[step.what] += done
                if self.measured is not None and done:
                    self.measured.removed(step.what, done)
                if done < limit:
                    break
                limit = min(most, limit * 2) if took_s < self.quick_s else max(least, limit // 2)
                self._stop.wait(max(self.pause_s, took_s * (1 - self.busy_share) / self.busy_share))
            if removed[step.what]:
                log.info("retention deleted %d %s", removed[step.what], step.what)
        if self.measured is not None and not self._stop.is_set():
            self.measured.round_finished()
        return removed

    def _next_s(self) -> float:
        return self.interval_s * self._rng.uniform(0.9, 1.1)

    def _loop(self) -> None:
        delays = backoff.Backoff(first_s=min(1.0, self.interval_s), max_s=self.interval_s)
        # The first round comes a while after the start, not at once: replicas started together spread out.
        wait_s = self.interval_s * self._rng.uniform(0.1, 1.0)
        while not self._stop.wait(wait_s):
            try:
                self.run_once()
            except Exception as error:
                if outages.is_outage(error) or isinstance(error, outages.StoreUnavailable):
                    if delays.tries % outages.LOG_EVERY == 0:
                        log.warning("retention stopped short (%s); trying again", redact.describe(error))
                else:
                    log.exception("retention failed; trying again")
                wait_s = delays.next_s()
                continue
            delays.tries = 0
            wait_s = self._next_s()
