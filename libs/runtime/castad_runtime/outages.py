"""Telling the machinery's failures from the work's, and waiting out the machinery's.

A database or broker that is unreachable, restarting, out of connections or out of disk
is an outage: it says nothing about the work, so it must never use up a message or an
attempt. Code that meets one waits (with a capped, jittered backoff) and tries again.
Anything else (a constraint violation, a bug, a provider's answer) is not an outage.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pika.exceptions
import psycopg
import sqlalchemy as sa
from dramatiq.errors import BrokerConnectionError

from castad_runtime import backoff, redact

log = logging.getLogger(__name__)
T = TypeVar("T")
LOG_EVERY = 10  # while an outage lasts, log one failed try in this many

# SQLSTATEs that are the server's state, not the statement's: connection exceptions (08),
# insufficient resources (53: disk full, out of memory, too many connections), system errors
# (58), the server shutting down or starting (57P01-57P03), and conflicts a retry of the
# transaction resolves (serialization failure, deadlock, lock timeout, read-only during a failover).
_OUTAGE_CLASSES = frozenset({"08", "53", "58"})
# A session ended for idling in a transaction or for idling (25P03, 57P05) is one a process lost while it stood still.
_OUTAGE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "57P05", "25P03", "40001", "40P01", "55P03", "25006"})
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})
# A process short of memory, processes or files: the machine's state, not the work's.
_RESOURCE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EAGAIN, errno.EMFILE, errno.ENFILE})


def is_outage(error: BaseException) -> bool:
    """Whether `error` comes from the database, the broker, the network or the disk being unavailable."""
    if isinstance(error, sa.exc.DBAPIError):
        return error.connection_invalidated or _is_database_outage(error.orig)
    if isinstance(error, sa.exc.TimeoutError | sa.exc.DisconnectionError):  # pool exhausted, connection lost
        return True
    if isinstance(error, psycopg.Error):
        return _is_database_outage(error)
    if isinstance(error, pika.exceptions.AMQPConnectionError | pika.exceptions.AMQPChannelError):
        return True
    if isinstance(error, BrokerConnectionError | ConnectionError | TimeoutError):
        return True
    return isinstance(error, OSError) and error.errno in _DISK_ERRNOS


class StoreUnavailable(Exception):
    """The artifact store (an object store) could not be reached or refused to work."""


def is_resource_shortage(error: BaseException) -> bool:
    """Whether work failed because this machine ran short or the artifact store was unavailable.

    Short of disk, memory, processes or open files.

    Inside a provider's work only these are the machinery's failures: a network error or a
    timeout there is the provider's answer, and costs an attempt."""
    return isinstance(error, StoreUnavailable) or (isinstance(error, OSError) and error.errno in _RESOURCE_ERRNOS)


def _is_database_outage(error: BaseException | None) -> bool:
    if isinstance(error, psycopg.InterfaceError):
        return True
    if not isinstance(error, psycopg.Error):
        return False
    if error.sqlstate is None:  # the connection itself failed: refused, reset, not accepting connections
        return isinstance(error, psycopg.OperationalError)
    return error.sqlstate[:2] in _OUTAGE_CLASSES or error.sqlstate in _OUTAGE_SQLSTATES


class Stopped(Exception):
    """Waiting out an outage was given up: the service is stopping."""


class Outlasted(Exception):
    """Waiting out an outage was given up: it lasted longer than the caller would wait in one go."""


def keep_trying(
    action: Callable[[], T],
    what: str,
    stop: threading.Event | None = None,
    first_s: float = 0.1,
    max_s: float = 5.0,
    give_up_after_s: float | None = None,
) -> T:
    """`action()`, tried again after a backoff for as long as it fails on an outage.

    Any other error propagates. Raises Stopped if `stop` is set while waiting, Outlasted once `give_up_after_s`
    passed (the caller then does its waiting another way).
    """
    delays = backoff.Backoff(first_s, max_s)
    started = time.monotonic()
    while True:
        try:
            result = action()
        except Exception as error:
            if not is_outage(error):
                raise
            if give_up_after_s is not None and time.monotonic() - started > give_up_after_s:
                raise Outlasted(f"{what}: outage for over {give_up_after_s:g} s") from error
            if delays.tries % LOG_EVERY == 0:
                log.warning("%s: outage (%s); trying again", what, redact.describe(error))
            if delays.wait(stop):
                raise Stopped() from None
            continue
        if delays.tries:
            log.info("%s: outage over after %d tries", what, delays.tries)
        return result
