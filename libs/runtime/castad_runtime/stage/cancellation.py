"""Stopping an attempt's work for real: a token the provider checks, and child processes it kills.

The stage runner gives every attempt a `Cancellation`. It is cancelled when the attempt
runs out of time, when the service stops, when its job is canceled, or when the attempt's
claim is lost (its lease taken over). A provider waits and sleeps through it (`sleep`), checks it
between steps of long work (`check`), and runs child processes through it (`run`): each
child gets a session of its own, so a stop signal sent to the service's process group
(Ctrl-C, honcho, systemd, Kubernetes) does not reach it, and it is killed, with everything
it started, as soon as the attempt is cancelled. Should the service itself be killed
(SIGKILL, out of memory), the kernel kills the child too (PR_SET_PDEATHSIG), so no render
outlives the process that would record it.

The same token guards what leaves Castad: a provider calls `leaving` immediately before a request
that starts work at a network provider (`HttpProvider.submit` does), and the runner's fence lets it
go only while the attempt still holds its job (castad_runtime.stage.fence).
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from castad_runtime import db

T = TypeVar("T")

log = logging.getLogger(__name__)


class Reason(enum.StrEnum):
    TIMEOUT = "timeout"  # the attempt used up its time: a retryable failure, counted
    SHUTDOWN = "shutdown"  # the service is stopping: the attempt is handed back, not counted
    SUPERSEDED = "superseded"  # the claim was lost: somebody else records what became of the job
    CANCELED = "canceled"  # an operator or a deadline canceled the job: the cancel is recorded already


class Cancelled(Exception):
    """The attempt was cancelled before its work finished."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(f"attempt cancelled: {reason}")
        self.reason = reason


class Cancellation:
    def __init__(self, before_leaving: Callable[[], None] | None = None) -> None:
        self._before_leaving = before_leaving  # the runner's fence
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reason: Reason | None = None
        self._children: set[subprocess.Popen[str]] = set()
        self._waiters: set[threading.Event] = set()

    @property
    def reason(self) -> Reason | None:
        return self._reason

    def cancel(self, reason: Reason) -> None:
        """Cancel with `reason` (the first reason given stays) and kill every running child."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
            children = list(self._children)
            waiters = list(self._waiters)
        self._event.set()
        for waiter in waiters:
            waiter.set()
        for child in children:
            _kill_group(child)

    def check(self) -> None:
        """Raise Cancelled if the attempt was cancelled."""
        if self._reason is not None:
            raise Cancelled(self._reason)

    def leaving(self) -> None:
        """Call immediately before the attempt's work leaves Castad (a request that starts work at a provider).

        Raises Cancelled if the attempt was cancelled, and whatever the runner's fence raises
        (castad_runtime.stage.fence.Fenced) if the attempt's lease is not known to be held: then
        the work must not leave. Outside a runner (no fence) it only checks the cancellation."""
        self.check()
        if self._before_leaving is not None:
            self._before_leaving()

    def sleep(self, seconds: float | None) -> None:
        """Wait `seconds` (None: until cancelled); raise Cancelled as soon as the attempt is cancelled."""
        self._event.wait(seconds)
        self.check()

    def call(self, fn: Callable[[], T]) -> T:
        """Run a blocking call (a request to a network provider) and return what it returns.

        The call runs on a thread of its own so that a cancellation ends the attempt at once:
        Cancelled is raised as soon as the attempt is cancelled, and the abandoned call ends by
        its own timeout, its result dropped. Whatever the call raises is raised here. Refused
        inside a database transaction of the calling thread (db.TransactionOpen): the call's own
        thread holds none, so it is checked here.
        """
        db.outside("a call out")
        finished = threading.Event()
        result: dict[str, Any] = {}

        def target() -> None:
            try:
                result["value"] = fn()
            except BaseException as error:  # handed over to the waiting thread
                result["error"] = error
            finally:
                finished.set()

        with self._lock:
            self._waiters.add(finished)
        try:
            if self._reason is None:
                threading.Thread(target=target, name="provider-call", daemon=True).start()
                finished.wait()
        finally:
            with self._lock:
                self._waiters.discard(finished)
        self.check()
        if "error" in result:
            raise result["error"]
        value: T = result["value"]
        return value

    def run(self, command: Sequence[str], timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run a child process in its own session and return its exit status and output.

        Raises Cancelled if the attempt is cancelled meanwhile (the child's process group is
        killed), subprocess.TimeoutExpired after `timeout_s` (likewise killed), OSError if it
        cannot be started.
        """
        child = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            # preexec_fn is unsafe with threads when it takes locks; this one makes one system call.
            preexec_fn=_die_with_parent,
        )
        with self._lock:
            self._children.add(child)
        try:
            if self._reason is not None:  # cancelled between the check and the start
                _kill_group(child)
            try:
                stdout, stderr = child.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(child)
                child.communicate()
                raise
        finally:
            with self._lock:
                self._children.discard(child)
        self.check()
        return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    """In the child, before exec: be sent SIGKILL when the thread that started it dies (with its process)."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _kill_group(child: subprocess.Popen[str]) -> None:
    """SIGKILL the child's process group (its own session: the child is its leader)."""
    if child.poll() is not None:
        return
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # the group id was reused by another process: kill the child alone
        log.warning("could not signal process group %d; killing the child only", child.pid)
        child.kill()
