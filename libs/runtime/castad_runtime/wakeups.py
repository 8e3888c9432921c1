"""Wake-ups of a channel's listeners, sent once the writer's transaction committed, by a thread of their own.

A NOTIFY inside a transaction is delivered at its commit, but PostgreSQL serialises the commits of
notifying transactions under one lock of the whole server, held through the commit's WAL flush: such
commits share no flush with others (group commit) and wait their turn, across every database of the
server. Where a flush is quick and the cores are free that costs little; where a writer holding the lock
is descheduled, every other waits for it: on this machine, its two cores busy with other work, 32
writers committed a fifth as many transactions a second with a NOTIFY in each as without, and 70-90%
with the waker (`make bench-wakeups`, docs/reports/wakeups.md, measured quiet). And a listener that
stops reading fills the server's notification queue until every notifying commit fails.

So no writer's transaction notifies. `after_commit` asks the process's `Waker` for the channel to wake its
listeners once the transaction committed; the waker's thread sends one NOTIFY per distinct payload for
every poke that came since its last send, in one short transaction of its own on a connection of its own,
not durable (synchronous_commit off: a wake-up lost to a crash only leaves the rows to the listener's own
re-read), so it holds that lock for a moment. What the waker cannot send (the server out, the queue full)
is dropped, logged: the listeners find the rows by their own re-read (the relay's fallback_poll_s, an
event stream's), and the writer's commit succeeded long before.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import psycopg
import sqlalchemy as sa

from castad_runtime import db

log = logging.getLogger(__name__)

MIN_GAP_S = 0.005  # between two sends: at most 200 small transactions a second from a busy process
RETRY_AFTER_S = 1.0  # after a failed send, before the next (a server that is out is not asked in a loop)
WARN_EVERY_S = 60.0  # a waker that keeps failing says so once a minute


class Waker:
    """Sends the NOTIFYs of one channel on one database, from its own thread, coalescing what waits."""

    def __init__(self, url: str, channel: str) -> None:
        self._url = url
        self._channel = channel
        self._pending: set[str] = set()
        self._ready = threading.Condition()
        self._closed = False
        self._sending = False
        self._conn: psycopg.Connection[Any] | None = None
        self._warned_at = -WARN_EVERY_S
        self.sent = 0  # notifications sent, for tests and benchmarks
        self._thread = threading.Thread(target=self._run, name=f"waker-{channel}", daemon=True)
        self._thread.start()

    def poke(self, payload: str = "") -> None:
        """Wake the channel's listeners with `payload` soon; returns at once."""
        with self._ready:
            self._pending.add(payload)
            self._ready.notify_all()

    def settled(self, timeout_s: float = 5.0) -> bool:
        """Whether every poke so far was sent (or dropped) within `timeout_s`: for tests and benchmarks."""
        with self._ready:
            return self._ready.wait_for(lambda: not self._pending and not self._sending, timeout_s)

    def close(self) -> None:
        """Send what waits, then stop the thread and close its connection."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._pending and not self._closed:
                    self._ready.wait()
                if not self._pending:
                    break
                payloads, self._pending = self._pending, set()
                self._sending = True
            started = time.monotonic()
            sent = self._send(sorted(payloads))
            with self._ready:
                self._sending = False
                self._ready.notify_all()
            pause = MIN_GAP_S if sent else RETRY_AFTER_S
            time.sleep(max(0.0, pause - (time.monotonic() - started)))
        self._close()

    def _send(self, payloads: list[str]) -> bool:
        """Send `payloads`, once more on a new connection if the server ended the last one.

        The server may have ended the connection since its last use: a restart, a fail-over, an idle timeout. False
        if they could not be sent: they are dropped, logged.
        """
        reused = self._conn is not None and not self._conn.closed
        try:
            try:
                self._notify(payloads)
            except psycopg.OperationalError:
                if not reused:
                    raise
                self._notify(payloads)  # the reused connection had died: a new one is asked once
        except Exception as error:  # the thread must outlive anything a send meets
            self._close()
            now = time.monotonic()
            if now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                log.warning(
                    "could not wake the listeners of %s (they re-read by themselves): %s",
                    self._channel,
                    error,
                    exc_info=not isinstance(error, psycopg.Error),
                )
            return False
        self.sent += len(payloads)
        return True

    def _notify(self, payloads: list[str]) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(**db.connect_kwargs(self._url), autocommit=True)
            self._conn.execute("SET synchronous_commit = off")
        try:
            with self._conn.transaction():
                for payload in payloads:
                    self._conn.execute("SELECT pg_notify(%s, %s)", (self._channel, payload))
        except psycopg.OperationalError:
            self._close()
            raise

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_wakers: dict[tuple[str, str], Waker] = {}
_wakers_lock = threading.Lock()


def waker(url: str, channel: str) -> Waker:
    """This process's waker of `channel` on the database of `url`, started the first time it is asked for."""
    with _wakers_lock:
        found = _wakers.get((url, channel))
        if found is None:
            found = _wakers[(url, channel)] = Waker(url, channel)
        return found


def close_all() -> None:
    """Send what every waker of this process holds, then stop them (a stopping process, a test's teardown)."""
    with _wakers_lock:
        closing = list(_wakers.values())
        _wakers.clear()
    for found in closing:
        found.close()


def _forget_after_fork() -> None:
    """A forked child has none of its parent's threads: its wakers start anew when first asked for."""
    global _wakers_lock
    _wakers.clear()
    _wakers_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def after_commit(conn: sa.Connection, channel: str, payload: str = "") -> None:
    """Wake `channel`'s listeners with `payload` once the transaction of `conn` (a `db.transaction`) committed."""
    url = conn.engine.url.render_as_string(hide_password=False)
    db.after_commit(conn, lambda: waker(url, channel).poke(payload), key=("wake", url, channel, payload))
