"""A PostgreSQL primary and its synchronous standby on this machine, from Debian's postgresql.

Start them, kill the primary, promote the standby, make the old primary a standby again.

`PostgresPair`: `start()`, `url(database)`, `kill_primary()`, `stop_primary()`, `promote()`,
`rebuild_standby()`, `destroy()` (see `engines` for what the engines share).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

import psycopg
from psycopg import sql

from bench.faults import engines

log = engines.log


@dataclasses.dataclass(frozen=True)
class PostgresNode:
    """One server of the pair; `name` is also the application_name it streams from the primary as."""

    name: str
    port: int
    data: pathlib.Path

    @property
    def log(self) -> pathlib.Path:
        return self.data.parent / f"{self.name}.log"


SHARED_SETTINGS = """
# bench/faults/cluster.py: one of a primary and its synchronous standby (the same file on both)
listen_addresses = '127.0.0.1'
unix_socket_directories = ''  # TCP only
max_connections = 300  # about ten service processes, each pooling 10 to 25 connections
shared_buffers = 32MB
wal_level = replica
max_wal_senders = 4
wal_keep_size = 256MB  # a standby that falls behind catches up from here
hot_standby = on
# A standby retries its primary this often; a promotion requested meanwhile waits for the retry
# (PostgreSQL 15: with the default 5 s, every failover after a kill -9 took 5 s).
wal_retrieve_retry_interval = 500ms
log_line_prefix = '%m [%p] %q%a '
include = 'node.conf'  # what differs between the two: the port
"""
HBA = """\
host all postgres 127.0.0.1/32 trust
host replication postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
"""


class PostgresPair:
    """A PostgreSQL primary and a synchronous hot standby on 127.0.0.1, swapped by a failover.

    The primary is the newest Debian installed: 15 on bookworm.

    Their data directories go to a directory of their own under /var/tmp, not under `workdir`:
    the server runs as the postgres OS user, who must reach them, and a caller's work directory
    may sit below directories closed to other users (pytest's are 0700); opening those up would
    open everything else below them too. /var/tmp is reachable by everyone and on disk. The
    servers' logs are copied into `workdir`/postgres when the pair is destroyed.
    """

    def __init__(self, workdir: pathlib.Path, *, timeout_s: float = engines.START_TIMEOUT_S) -> None:
        self.logs = workdir / "postgres"
        self.root = pathlib.Path("/var/tmp") / f"castad-pg-{secrets.token_hex(6)}"
        self.timeout_s = timeout_s
        ports = engines.distinct_free_ports(2)
        self.nodes = tuple(PostgresNode(f"pg{i}", ports[i - 1], self.root / f"pg{i}") for i in (1, 2))
        self.primary, self.standby = self.nodes
        self._postmasters: set[int] = set()  # every one started, for the shared memory a killed one leaves

    def start(self) -> PostgresPair:
        """Make the primary, clone the standby from it, wait until the standby streams as `sync`."""
        engines.require_programs()
        started = time.monotonic()
        self.root.mkdir(mode=0o700)
        _give_to_postgres(self.root)
        self._as_postgres(
            [engines.POSTGRES_BIN / "initdb", "-D", self.primary.data, "-U", "postgres", "--auth=trust"]
            + ["--encoding=UTF8", "--locale=C", "--no-instructions", "--no-sync"],  # a throwaway cluster
            "initdb",
        )
        with (self.primary.data / "postgresql.conf").open("a") as conf:
            conf.write(SHARED_SETTINGS)
        _write_as_postgres(self.primary.data / "pg_hba.conf", HBA)
        self._write_node_conf(self.primary)
        self._pg_ctl(self.primary, "start")
        self._clone_standby()
        log.info("postgresql: primary and synchronous standby up in %.1f s", time.monotonic() - started)
        return self

    def url(self, database: str) -> str:
        """A SQLAlchemy URL naming both servers; libpq picks whichever takes writes."""
        hosts = "&".join(f"host={engines.LOCALHOST}:{node.port}" for node in self.nodes)
        return f"postgresql+psycopg://postgres@/{database}?{hosts}&target_session_attrs=read-write"

    def primary_port(self) -> int:
        return self.primary.port

    def standby_port(self) -> int:
        return self.standby.port

    def kill_primary(self) -> None:
        """kill -9 of the primary's postmaster and every process it started, as a lost machine ends them.

        Each of PostgreSQL's processes leads a process group of its own, so killing the postmaster's
        group would leave its backends to finish what they were doing; they are found and killed
        with it instead (the postmaster stopped first, so that it starts no new one meanwhile).
        """
        pid = self._postmaster(self.primary)
        if pid is None:
            raise engines.ClusterError(f"the primary {self.primary.name} is not running")
        os.kill(pid, signal.SIGSTOP)
        doomed = [pid, *engines.children(pid)]
        for each in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)
        engines.wait_until(
            f"{self.primary.name}'s processes gone", lambda: not any(map(engines.alive, doomed)), engines.STOP_TIMEOUT_S
        )

    def stop_primary(self) -> None:
        """Stop the primary gracefully: it ships every WAL record to the standby before it exits."""
        self._pg_ctl(self.primary, "stop", "-m", "fast")

    def promote(self) -> None:
        """Make the standby the primary.

        It commits without waiting for a standby until one is rebuilt (as Patroni's non-strict synchronous mode
        does).
        """
        if self._postmaster(self.primary) is not None:
            raise engines.ClusterError(f"{self.primary.name} still runs: promoting would make two primaries")
        if self._postmaster(self.standby) is None:
            raise engines.ClusterError(f"the standby {self.standby.name} is not running: there is nothing to promote")
        with self._connect(self.standby) as conn:  # ALTER SYSTEM writes a file: a standby may run it
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
            conn.execute("SELECT pg_reload_conf()")
        started = time.monotonic()
        self._pg_ctl(self.standby, "promote")
        self.primary, self.standby = self.standby, self.primary
        log.info("postgresql: %s promoted in %.1f s", self.primary.name, time.monotonic() - started)

    def rebuild_standby(self) -> None:
        """Make the old primary (down) a synchronous standby of the new one, from a fresh base backup."""
        if self._postmaster(self.standby) is not None:
            raise engines.ClusterError(f"{self.standby.name} still runs: stop or kill it before it is rebuilt")
        started = time.monotonic()
        shutil.rmtree(self.standby.data, ignore_errors=True)
        self._clone_standby()
        log.info("postgresql: %s rebuilt as a standby in %.1f s", self.standby.name, time.monotonic() - started)

    def destroy(self) -> None:
        """Stop both servers at once, keep their logs in `workdir`/postgres, remove the rest."""
        for node in self.nodes:
            if self._postmaster(node) is not None:
                with contextlib.suppress(engines.ClusterError):
                    self._pg_ctl(node, "stop", "-m", "immediate")
        self.logs.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            if node.log.exists():
                shutil.copyfile(node.log, self.logs / node.log.name)
        _remove_shared_memory(self._postmasters)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- internals

    def _clone_standby(self) -> None:
        """Base-backup the primary into the standby's directory, start it, make it the synchronous one."""
        primary, standby = self.primary, self.standby
        source = f"host={engines.LOCALHOST} port={primary.port} user=postgres application_name={standby.name}"
        self._as_postgres(
            [engines.POSTGRES_BIN / "pg_basebackup", "-D", standby.data, "-d", source, "-R", "-X", "stream"]
            + ["--checkpoint=fast", "--no-sync"],  # only processes die here, never the machine's page cache
            f"pg_basebackup of {standby.name}",
        )
        self._write_node_conf(standby)  # the copy has the primary's port
        self._pg_ctl(standby, "start")
        with self._connect(primary) as conn:
            conn.execute(
                sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(sql.Literal(f'"{standby.name}"'))
            )
            conn.execute("SELECT pg_reload_conf()")

            def synchronous() -> bool:
                row = conn.execute(
                    "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s", (standby.name,)
                ).fetchone()
                return row == ("streaming", "sync")

            engines.wait_until(f"{standby.name} streaming as sync", synchronous, self.timeout_s, standby.log)

    def _write_node_conf(self, node: PostgresNode) -> None:
        _write_as_postgres(node.data / "node.conf", f"port = {node.port}\n")

    def _pg_ctl(self, node: PostgresNode, action: str, *options: str) -> None:
        command = [engines.POSTGRES_BIN / "pg_ctl", "-D", node.data, "-w", "-t", str(int(self.timeout_s)), *options]
        if action == "start":
            command += ["-l", node.log]
        self._as_postgres([*command, action], f"pg_ctl {action} of {node.name}", node.log)
        if action == "start" and (pid := self._postmaster(node)) is not None:
            self._postmasters.add(pid)

    def _as_postgres(self, command: Sequence[object], what: str, log_file: pathlib.Path | None = None) -> None:
        """Run a program as the postgres OS user (the server refuses to run as root)."""
        arguments = [str(engines.RUNUSER), "-u", "postgres", "--", *map(str, command)]
        try:
            done = subprocess.run(arguments, cwd=self.root, capture_output=True, text=True, timeout=self.timeout_s + 10)
        except subprocess.TimeoutExpired:
            raise engines.ClusterError(f"{what}: not done in {self.timeout_s} s{engines.tail(log_file)}") from None
        if done.returncode != 0:
            raise engines.ClusterError(
                f"{what} failed:\n{(done.stderr or done.stdout).strip()}{engines.tail(log_file)}"
            )

    def _connect(self, node: PostgresNode) -> psycopg.Connection[tuple[object, ...]]:
        info = f"host={engines.LOCALHOST} port={node.port} user=postgres dbname=postgres connect_timeout=5"
        return psycopg.connect(info, autocommit=True)

    def _postmaster(self, node: PostgresNode) -> int | None:
        """The pid of the node's running postmaster, if one runs (postmaster.pid's first line)."""
        try:
            pid = int((node.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if engines.alive(pid) else None


def _give_to_postgres(path: pathlib.Path) -> None:
    account = pwd.getpwnam("postgres")
    os.chown(path, account.pw_uid, account.pw_gid)


def _write_as_postgres(path: pathlib.Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)
    _give_to_postgres(path)


def _remove_shared_memory(postmasters: set[int]) -> None:
    """Remove the System V segments that killed postmasters left behind (a stopped one removes its own)."""
    table = pathlib.Path("/proc/sysvipc/shm")
    if not table.exists():
        return
    owner = str(pwd.getpwnam("postgres").pw_uid)
    header, *rows = (line.split() for line in table.read_text().splitlines())
    for row in rows:
        fields = dict(zip(header, row, strict=False))
        if int(fields["cpid"]) in postmasters and fields["nattch"] == "0" and fields["uid"] == owner:
            subprocess.run(["ipcrm", "-m", fields["shmid"]], capture_output=True, check=False)
