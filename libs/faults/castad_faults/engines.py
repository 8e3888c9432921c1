"""What the clustered engines of a fault run share: the programs they need, errors, processes, waiting.

`rabbitmq.RabbitCluster` (three RabbitMQ nodes) and `postgres.PostgresCluster` (a PostgreSQL primary and
its synchronous standbys) run from Debian's packages beside the system's RabbitMQ and PostgreSQL, which
they leave alone: their own ports (below the ephemeral range), node names, epmd, data directories and
Erlang cookie. Every wait is bounded and a failure is a `ClusterError` that quotes the end of the
engine's log.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import pathlib
import pwd
import socket
import time
from collections.abc import Callable

import psycopg
from castad_local import stack

log = logging.getLogger("castad_faults.engines")

RABBITMQ_BIN = pathlib.Path("/usr/lib/rabbitmq/bin")


def _newest_postgres() -> pathlib.Path:
    """The programs of the newest PostgreSQL Debian installed (15 on bookworm)."""
    versions = sorted(
        (path for path in pathlib.Path("/usr/lib/postgresql").glob("*") if path.name.isdigit()),
        key=lambda path: int(path.name),
    )
    return (versions[-1] if versions else pathlib.Path("/usr/lib/postgresql/15")) / "bin"


POSTGRES_BIN = _newest_postgres()
# Debian's libfaketime: a server started with it preloaded runs its clock ahead (postgres.PostgresCluster).
FAKETIME = next(iter(sorted(pathlib.Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), pathlib.Path("libfaketime"))
EPMD = pathlib.Path("/usr/bin/epmd")
RUNUSER = pathlib.Path("/usr/sbin/runuser")
PROGRAMS = (
    RABBITMQ_BIN / "rabbitmq-server",
    RABBITMQ_BIN / "rabbitmqctl",
    RABBITMQ_BIN / "rabbitmq-queues",
    EPMD,
    POSTGRES_BIN / "initdb",
    POSTGRES_BIN / "pg_ctl",
    POSTGRES_BIN / "pg_basebackup",
    RUNUSER,
)
HOW = (
    "run `make setup` as root (it installs Debian's rabbitmq-server, postgresql and libfaketime where they are missing)"
)
LOCALHOST = "127.0.0.1"
START_TIMEOUT_S = 90.0  # a node's boot: the first alone, then two joining it at once, about 19 s on two cores
STOP_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 60.0
POLL_S = 0.1
JOIN_RETRY_S = 0.25


class ClusterError(Exception):
    """An engine did not start, stop or answer in time; the message quotes its log."""


def missing() -> list[str]:
    """What this machine lacks to run the engines (nothing when `make setup` ran as root)."""
    absent = [str(program) for program in PROGRAMS if not os.access(program, os.X_OK)]
    if not FAKETIME.is_file():
        absent.append("Debian's libfaketime")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        absent.append("the postgres OS user")
    if os.geteuid() != 0:
        absent.append("root's rights (runuser, to run PostgreSQL as the postgres user)")
    return absent


def require_programs() -> None:
    if absent := missing():
        raise ClusterError(f"missing {', '.join(absent)}: {HOW}")


def distinct_free_ports(count: int) -> list[int]:
    """`count` different free ports below the ephemeral range (`stack.free_port` picks each at random)."""
    ports: list[int] = []
    while len(ports) < count:
        if (port := stack.free_port()) not in ports:
            ports.append(port)
    return ports


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((LOCALHOST, port)) == 0


def alive(pid: int) -> bool:
    """Whether `pid` runs: not gone, not a zombie (this machine's init does not reap orphans)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children(pid: int) -> list[int]:
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(proc.name))
    return found


def wait_until(
    what: str,
    done: Callable[[], bool],
    timeout_s: float,
    log_file: pathlib.Path | None = None,
    *,
    transient: tuple[type[Exception], ...] = (psycopg.OperationalError, OSError),
) -> None:
    """Poll `done` until it holds; the `transient` errors it raises (not up yet) only mean "not yet"."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if done():
                return
        except transient as error:
            last_error = error
        time.sleep(POLL_S)
    reason = f" (last: {str(last_error).strip().splitlines()[-1]})" if last_error else ""
    raise ClusterError(f"no {what} within {timeout_s:.0f} s{reason}{tail(log_file)}")


def tail(*paths: pathlib.Path | None, lines: int = 15) -> str:
    """The end of the first of `paths` that exists, to quote in an error."""
    for path in paths:
        if path is not None and path.exists():
            with path.open(errors="replace") as text:
                return f"\nthe end of {path}:\n" + "".join(collections.deque(text, maxlen=lines))
    return ""
