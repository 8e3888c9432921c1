"""Which failures are the machinery's (wait and try again, nothing used up) and which are not."""

from __future__ import annotations

import errno

import pika.exceptions
import psycopg
import pytest
import sqlalchemy as sa
from castad_runtime import backoff, outages


def wrapped(error: psycopg.Error) -> sa.exc.DBAPIError:
    return sa.exc.DBAPIError.instance("SELECT 1", {}, error, psycopg.Error)


@pytest.mark.parametrize(
    "error",
    [
        psycopg.OperationalError("connection failed: connection refused"),  # no SQLSTATE: could not connect
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.CannotConnectNow("the database system is starting up"),
        psycopg.errors.TooManyConnections("sorry, too many clients already"),
        psycopg.errors.DiskFull("could not extend file"),
        psycopg.errors.SerializationFailure("could not serialize access"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
        psycopg.InterfaceError("the connection is closed"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_database_that_is_unreachable_overloaded_or_in_a_transient_conflict_is_an_outage(error):
    assert outages.is_outage(error)
    assert outages.is_outage(wrapped(error))


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.UniqueViolation("duplicate key"),
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.ProgramLimitExceeded("index row size exceeds maximum"),
        psycopg.errors.UndefinedTable("relation does not exist"),
        psycopg.errors.InvalidTextRepresentation("invalid input syntax"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_statement_that_fails_for_its_own_sake_is_not_an_outage(error):
    assert not outages.is_outage(error)
    assert not outages.is_outage(wrapped(error))


def test_a_pool_with_no_connection_free_in_time_is_an_outage():
    """The gateway's consumer threads outnumber its projection's connections.

    A thread that waits too long for one tries again, its message kept.
    """
    error = sa.exc.TimeoutError("QueuePool limit of size 4 overflow 4 reached, connection timed out, timeout 30.00")
    assert outages.is_outage(error)


def test_broker_and_network_failures_are_outages_but_not_shortages_inside_work():
    for error in (pika.exceptions.AMQPConnectionError(), ConnectionResetError(), TimeoutError()):
        assert outages.is_outage(error)
        assert not outages.is_resource_shortage(error)  # from a provider: its answer, counted


def test_a_machine_short_of_disk_memory_processes_or_files_is_the_machinerys_failure():
    for code in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EAGAIN, errno.EMFILE):
        assert outages.is_resource_shortage(OSError(code, "short"))
    assert not outages.is_resource_shortage(FileNotFoundError(errno.ENOENT, "no such file"))
    assert not outages.is_outage(ValueError("a bug"))


def test_backoff_doubles_up_to_its_ceiling():
    delays = backoff.Backoff(first_s=0.1, max_s=1.0, jitter=0.0)
    assert [round(delays.next_s(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
