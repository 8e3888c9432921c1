"""A PostgreSQL primary and its synchronous standbys on this machine, from Debian's postgresql.

Start them, kill the primary, promote the standby that has the most of its WAL, follow it with the others, make the
old primary a standby again; kill a standby and start it again.

`PostgresCluster`: `start()`, `url(database)`, `kill_primary()`, `stop_primary()`, `promote()`,
`rebuild_standby()`, `kill_standby()`, `start_standby()`, `destroy()` (see `engines` for what the engines share).
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

from castad_faults import engines

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
# castad_faults/postgres.py: one of a primary and its synchronous standbys (the same file on each)
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
include = 'node.conf'  # what differs between them: the port
"""
HBA = """\
host all postgres 127.0.0.1/32 trust
host replication postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
"""


class PostgresCluster:
    """A PostgreSQL primary and `standbys` hot standbys on 127.0.0.1, a commit waiting for any one of them.

    `synchronous_standby_names = 'ANY 1 (...)'` names every standby: a commit returns once one of them has it, so the
    loss of a standby stops no commit, and the standby with the most WAL has every commit that returned. With one
    standby, that one. A failover promotes that standby, and the others follow it.

    Every server started as a standby (a rebuilt one too) runs its clock `clock_ahead_s` ahead of the machine's
    (Debian's libfaketime): the one promoted is a primary whose clock is ahead of the one before.

    The primary is the newest Debian installed: 15 on bookworm.

    Their data directories go to a directory of their own under /var/tmp, not under `workdir`:
    the server runs as the postgres OS user, who must reach them, and a caller's work directory
    may sit below directories closed to other users (pytest's are 0700); opening those up would
    open everything else below them too. /var/tmp is reachable by everyone and on disk. The
    servers' logs are copied into `workdir`/postgres when the cluster is destroyed.
    """

    def __init__(
        self,
        workdir: pathlib.Path,
        *,
        standbys: int = 1,
        clock_ahead_s: float = 0.0,
        timeout_s: float = engines.START_TIMEOUT_S,
    ) -> None:
        self.logs = workdir / "postgres"
        self.root = pathlib.Path("/var/tmp") / f"castad-pg-{secrets.token_hex(6)}"
        self.timeout_s = timeout_s
        self.clock_ahead_s = clock_ahead_s
        ports = engines.distinct_free_ports(standbys + 1)
        self.nodes = tuple(PostgresNode(f"pg{i + 1}", port, self.root / f"pg{i + 1}") for i, port in enumerate(ports))
        self.primary = self.nodes[0]
        self._postmasters: set[int] = set()  # every one started, for the shared memory a killed one leaves

    @property
    def standbys(self) -> list[PostgresNode]:
        return [node for node in self.nodes if node != self.primary]

    def start(self) -> PostgresCluster:
        """Make the primary, clone each standby from it, wait until they stream as synchronous ones."""
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
        for standby in self.standbys:
            self._clone(standby)
        self._synchronous()
        log.info(
            "postgresql: a primary and %d synchronous standbys up in %.1f s",
            len(self.standbys),
            time.monotonic() - started,
        )
        return self

    def url(self, database: str) -> str:
        """A SQLAlchemy URL naming every server; libpq picks whichever takes writes."""
        hosts = "&".join(f"host={engines.LOCALHOST}:{node.port}" for node in self.nodes)
        return f"postgresql+psycopg://postgres@/{database}?{hosts}&target_session_attrs=read-write"

    def primary_port(self) -> int:
        return self.primary.port

    def kill_primary(self) -> None:
        """kill -9 of the primary, as a lost machine ends it (`_kill`)."""
        self._kill(self.primary)

    def stop_primary(self) -> None:
        """Stop the primary gracefully: it ships every WAL record to the standbys before it exits."""
        self._pg_ctl(self.primary, "stop", "-m", "fast")

    def kill_standby(self, node: PostgresNode) -> None:
        """kill -9 of a standby: commits go on, acknowledged by another (`_kill`)."""
        if node == self.primary:
            raise engines.ClusterError(f"{node.name} is the primary, not a standby")
        self._kill(node)

    def start_standby(self, node: PostgresNode) -> None:
        """Start a standby that was killed again; it catches up from the primary's WAL kept for it."""
        self._start(node)
        self._wait_streaming(node)

    def promote(self) -> None:
        """Make the standby with the most of the dead primary's WAL the primary; the other standbys follow it.

        It commits without waiting for a standby until the old primary is rebuilt (as Patroni's non-strict
        synchronous mode does).
        """
        if self._postmaster(self.primary) is not None:
            raise engines.ClusterError(f"{self.primary.name} still runs: promoting would make two primaries")
        received = {node: self._received(node) for node in self.standbys if self._postmaster(node) is not None}
        if not received:
            raise engines.ClusterError("no standby runs: there is nothing to promote")
        chosen = max(received, key=lambda node: received[node])
        with self._connect(chosen) as conn:  # ALTER SYSTEM writes a file: a standby may run it
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
            conn.execute("SELECT pg_reload_conf()")
        started = time.monotonic()
        self._pg_ctl(chosen, "promote")
        self.primary = chosen
        for node in received:
            if node != chosen:
                self._follow(node)
        log.info("postgresql: %s promoted in %.1f s", chosen.name, time.monotonic() - started)

    def rebuild_standby(self) -> None:
        """Make every server that is down (the old primary) a standby of the primary again, from a fresh base backup.

        Commits wait for a standby again once all of them stream.
        """
        started = time.monotonic()
        for node in self.standbys:
            if self._postmaster(node) is None:
                shutil.rmtree(node.data, ignore_errors=True)
                self._clone(node)
        self._synchronous()
        log.info("postgresql: standbys rebuilt in %.1f s", time.monotonic() - started)

    def destroy(self) -> None:
        """Stop every server at once, keep their logs in `workdir`/postgres, remove the rest."""
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

    def _kill(self, node: PostgresNode) -> None:
        """kill -9 of a server's postmaster and every process it started, as a lost machine ends them.

        Each of PostgreSQL's processes leads a process group of its own, so killing the postmaster's
        group would leave its backends to finish what they were doing; they are found and killed
        with it instead (the postmaster stopped first, so that it starts no new one meanwhile).
        """
        pid = self._postmaster(node)
        if pid is None:
            raise engines.ClusterError(f"{node.name} is not running")
        os.kill(pid, signal.SIGSTOP)
        doomed = [pid, *engines.children(pid)]
        for each in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)
        engines.wait_until(
            f"{node.name}'s processes gone", lambda: not any(map(engines.alive, doomed)), engines.STOP_TIMEOUT_S
        )

    def _source(self, standby: PostgresNode) -> str:
        """How a standby connects to the primary to stream from it (its name is its application_name)."""
        return f"host={engines.LOCALHOST} port={self.primary.port} user=postgres application_name={standby.name}"

    def _clone(self, standby: PostgresNode) -> None:
        """Base-backup the primary into the standby's directory, start it, wait until it streams."""
        source = self._source(standby)
        self._as_postgres(
            [engines.POSTGRES_BIN / "pg_basebackup", "-D", standby.data, "-d", source, "-R", "-X", "stream"]
            + ["--checkpoint=fast", "--no-sync"],  # only processes die here, never the machine's page cache
            f"pg_basebackup of {standby.name}",
        )
        self._write_node_conf(standby)  # the copy has the primary's port
        self._start(standby)
        self._wait_streaming(standby)

    def _follow(self, standby: PostgresNode) -> None:
        """Point a running standby at the new primary; it follows the new timeline (its WAL is not ahead of it)."""
        with self._connect(standby) as conn:
            conn.execute(sql.SQL("ALTER SYSTEM SET primary_conninfo = {}").format(sql.Literal(self._source(standby))))
            conn.execute("SELECT pg_reload_conf()")
        self._wait_streaming(standby)

    def _synchronous(self) -> None:
        """Make every standby a synchronous one (ANY 1 of them: a quorum), and wait until each streams as one."""
        names = ", ".join(f'"{node.name}"' for node in self.standbys)
        quorum = len(self.standbys) > 1
        with self._connect(self.primary) as conn:
            conn.execute(
                sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(
                    sql.Literal(f"ANY 1 ({names})" if quorum else names)
                )
            )
            conn.execute("SELECT pg_reload_conf()")
            wanted = sorted((node.name, "quorum" if quorum else "sync") for node in self.standbys)

            def synchronous() -> bool:
                return sorted(conn.execute("SELECT application_name, sync_state FROM pg_stat_replication")) == wanted

            engines.wait_until("every standby streaming as a synchronous one", synchronous, self.timeout_s)

    def _wait_streaming(self, standby: PostgresNode) -> None:
        with self._connect(self.primary) as conn:

            def streaming() -> bool:
                row = conn.execute(
                    "SELECT state FROM pg_stat_replication WHERE application_name = %s", (standby.name,)
                ).fetchone()
                return row == ("streaming",)

            engines.wait_until(f"{standby.name} streaming", streaming, self.timeout_s, standby.log)

    def _received(self, standby: PostgresNode) -> int:
        """How far into the WAL the standby has it (received, or replayed from its archive): bytes."""
        with self._connect(standby) as conn:
            row = conn.execute(
                "SELECT (greatest(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn()) - '0/0'::pg_lsn)::bigint"
            ).fetchone()
        return row[0] if row and isinstance(row[0], int) else 0

    def _write_node_conf(self, node: PostgresNode) -> None:
        _write_as_postgres(node.data / "node.conf", f"port = {node.port}\n")

    def _start(self, node: PostgresNode) -> None:
        """Start a server; a standby's clock `clock_ahead_s` ahead of the machine's.

        The lock file a killed server left is removed first: its pid may still be there, a zombie (this machine's
        init reaps no orphans), which the server would take for a server still running.
        """
        if self._postmaster(node) is None:
            (node.data / "postmaster.pid").unlink(missing_ok=True)
        ahead = node != self.primary and self.clock_ahead_s
        self._pg_ctl(node, "start", clock_ahead_s=self.clock_ahead_s if ahead else 0.0)

    def _pg_ctl(self, node: PostgresNode, action: str, *options: str, clock_ahead_s: float = 0.0) -> None:
        command = [engines.POSTGRES_BIN / "pg_ctl", "-D", node.data, "-w", "-t", str(int(self.timeout_s)), *options]
        if action == "start":
            command += ["-l", node.log]
        if clock_ahead_s:  # the server's wall clock only: its timeouts and waits keep the machine's monotonic one
            command = [
                "env",
                f"LD_PRELOAD={engines.FAKETIME}",
                f"FAKETIME=+{clock_ahead_s:g}s",
                "FAKETIME_DONT_FAKE_MONOTONIC=1",
                *command,
            ]
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
