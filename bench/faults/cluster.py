"""Clustered engines on this one machine: three RabbitMQ nodes, a PostgreSQL primary and its standby.

They run from Debian's packages beside the system's RabbitMQ and PostgreSQL, which they leave
alone: their own ports (below the ephemeral range), node names, epmd, data directories and
Erlang cookie. What a fault run or a test needs to lose a node and get it back:

- `RabbitCluster`: `start()`, `urls()`, `grant(users)`, `add_user()`, `kill(node)`, `stop(node)`,
  `start_node(node)`, `leader_of(queue)`, `rabbitmqctl()`, `destroy()`;
- `PostgresPair`: `start()`, `url(database)`, `kill_primary()`, `stop_primary()`, `promote()`,
  `rebuild_standby()`, `destroy()`.

Every wait is bounded and a failure is a `ClusterError` that quotes the end of the engine's log.
`destroy()` removes everything but the logs, which stay in the work directory.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence

import psycopg
from castad_contracts import topology
from castad_local import privileges, stack
from psycopg import sql

log = logging.getLogger("bench.faults.cluster")

RABBITMQ_BIN = pathlib.Path("/usr/lib/rabbitmq/bin")
POSTGRES_BIN = pathlib.Path("/usr/lib/postgresql/15/bin")
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
HOW = "run `make setup` as root (it installs Debian's rabbitmq-server and postgresql)"
LOCALHOST = "127.0.0.1"
START_TIMEOUT_S = 90.0  # a node's boot; three booting at once on two cores take about 8.5 s
STOP_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 60.0
POLL_S = 0.1
JOIN_RETRY_S = 0.25


class ClusterError(Exception):
    """An engine did not start, stop or answer in time; the message quotes its log."""


def missing() -> list[str]:
    """What this machine lacks to run the engines (nothing when `make setup` ran as root)."""
    absent = [str(program) for program in PROGRAMS if not os.access(program, os.X_OK)]
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        absent.append("the postgres OS user")
    if os.geteuid() != 0:
        absent.append("root's rights (runuser, to run PostgreSQL as the postgres user)")
    return absent


def _require_programs() -> None:
    if absent := missing():
        raise ClusterError(f"missing {', '.join(absent)}: {HOW}")


# -- RabbitMQ -----------------------------------------------------------------------------------


@dataclasses.dataclass
class RabbitNode:
    """One node of the cluster: its ports, files and, while it runs, its process."""

    name: str  # rabbit1@localhost
    amqp_port: int
    dist_port: int
    data: pathlib.Path  # configuration, mnesia; removed by destroy()
    logs: pathlib.Path  # RABBITMQ_LOG_BASE and the server's own output; kept
    process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> pathlib.Path:
        return self.logs / f"{self.name}.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class RabbitCluster:
    """`size` RabbitMQ nodes (`rabbit1@localhost` ...) joined in one cluster, each on its own ports.

    Files go to `workdir`/rabbitmq: `data/` (a HOME with the cluster's Erlang cookie, each node's
    configuration and database) and `logs/`. The nodes register with an epmd of their own, so
    that neither the system's node names nor its epmd are touched.
    """

    def __init__(self, workdir: pathlib.Path, size: int = 3, *, timeout_s: float = START_TIMEOUT_S) -> None:
        self.root = workdir / "rabbitmq"
        self.home = self.root / "data" / "home"
        self.timeout_s = timeout_s
        ports = _distinct_free_ports(2 * size + 1)
        self.epmd_port = ports.pop()
        self.nodes = tuple(
            RabbitNode(
                name=f"rabbit{i}@localhost",
                amqp_port=ports.pop(),
                dist_port=ports.pop(),
                data=self.root / "data" / f"rabbit{i}",
                logs=self.root / "logs" / f"rabbit{i}",
            )
            for i in range(1, size + 1)
        )
        self._epmd: subprocess.Popen[bytes] | None = None

    # -- the cluster as a whole

    def start(self) -> RabbitCluster:
        """Boot every node at once, each but the first joining the first as it boots; return once
        every node answers AMQP and the first sees them all running."""
        _require_programs()
        started = time.monotonic()
        self._write_files()
        self._start_epmd()
        for node in self.nodes:
            self._spawn(node)
        for node in self.nodes:
            self._wait_answering(node)
        self._wait_clustered(self.nodes[0])
        log.info("rabbitmq: %d nodes clustered in %.1f s", len(self.nodes), time.monotonic() - started)
        return self

    def urls(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> list[str]:
        """The AMQP URL of every node, in the order of `nodes` (guest may log in from 127.0.0.1 only)."""
        return [self.url(node.name, user, password, vhost) for node in self.nodes]

    def url(self, node: str, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        credentials = f"{urllib.parse.quote(user, safe='')}:{urllib.parse.quote(password, safe='')}"
        return f"amqp://{credentials}@{LOCALHOST}:{self._node(node).amqp_port}/{urllib.parse.quote(vhost, safe='')}"

    def add_vhost(self, vhost: str) -> None:
        self._import_definitions({"vhosts": [{"name": vhost}]})

    def add_user(self, user: str, password: str, vhost: str = "/", permissions: Sequence[str] = (".*",) * 3) -> None:
        """A broker user with `permissions` (configure, write, read) on `vhost`, made if missing."""
        self._import_definitions(_definitions(vhost, {user: (password, tuple(permissions))}))

    def grant(self, users: privileges.Users, vhost: str = "/") -> None:
        """Make `vhost` and every service's broker user of `users`, with `Topology.permissions`.

        The same users as `privileges.grant_rabbitmq` makes on the system's broker, in one import
        of definitions instead of two rabbitmqctl calls per user (each about half a second).
        """
        topo = topology.Topology(users.namespace)
        wanted = {
            users.name(service): (users.passwords[service], dataclasses.astuple(topo.permissions(service)))
            for service in privileges.USERS
        }
        self._import_definitions(_definitions(vhost, wanted))

    def leader_of(self, queue: str, vhost: str = "/", timeout_s: float = 30.0) -> str:
        """The node that leads quorum queue `queue`, once its members agree on one (an election after
        its leader's loss takes a few seconds)."""
        found: list[str] = []
        status = ("quorum_status", queue, "--vhost", vhost, "--formatter", "json")

        def elected() -> bool:
            rows = json.loads(self._run(RABBITMQ_BIN / "rabbitmq-queues", *status, node=self._any_running().name))
            found[:] = [row["Node Name"] for row in rows if row.get("Raft State") == "leader"]
            return len(found) == 1

        _wait_until(f"a leader of quorum queue {queue!r}", elected, timeout_s, transient=(ClusterError,))
        return found[0]

    def destroy(self) -> None:
        """Kill every node and the cluster's epmd; remove everything under `data/`, keep `logs/`."""
        for node in self.nodes:
            self._kill_process(node)
        if self._epmd is not None:
            self._epmd.kill()
            self._epmd.wait()
        shutil.rmtree(self.root / "data", ignore_errors=True)

    # -- one node

    def kill(self, node: str) -> None:
        """kill -9 of the node's Erlang VM (its epmd entry and connections go with it)."""
        target = self._node(node)
        if not target.running:
            raise ClusterError(f"{node} is not running")
        os.kill(self._beam_pid(target), signal.SIGKILL)
        self._wait_exited(target)

    def stop(self, node: str) -> None:
        """Stop the node gracefully (`rabbitmqctl stop`): it hands its queue leaderships over first."""
        target = self._node(node)
        self.rabbitmqctl("stop", node=target.name)
        self._wait_exited(target)

    def start_node(self, node: str) -> None:
        """Start a node that was killed or stopped; return once it runs in the cluster again and every
        quorum queue it is a member of has it back online."""
        target = self._node(node)
        if target.running:
            raise ClusterError(f"{node} is already running")
        started = time.monotonic()
        self._spawn(target)
        self._wait_answering(target)
        self._wait_clustered(target)
        _wait_until(
            f"{node}'s quorum queue members online",
            lambda: self._members_online(target),
            self.timeout_s,
            target.log,
            transient=(ClusterError,),
        )
        log.info("rabbitmq: %s back in %.1f s", node, time.monotonic() - started)

    def rabbitmqctl(self, *arguments: str, node: str | None = None) -> str:
        """Run rabbitmqctl on `node` (by default a running one); its output."""
        return self._run(RABBITMQ_BIN / "rabbitmqctl", *arguments, node=node or self._any_running().name)

    # -- internals

    def _node(self, name: str) -> RabbitNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ValueError(f"no node {name!r}: one of {', '.join(node.name for node in self.nodes)}")

    def _any_running(self) -> RabbitNode:
        for node in self.nodes:
            if node.running:
                return node
        raise ClusterError("no node of the cluster is running")

    def _write_files(self) -> None:
        self.home.mkdir(parents=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(20))
        cookie.chmod(0o400)  # Erlang refuses a cookie others may read
        (self.root / "data" / "enabled_plugins").write_text("[].\n")  # not the system's (management: port 15672)
        (self.root / "data" / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's (its NODENAME, ERL_FLAGS)
        first = self.nodes[0]
        for node in self.nodes:
            node.data.mkdir(parents=True)
            node.logs.mkdir(parents=True)
            (node.data / "rabbitmq.config").write_text(self._config(node, join=node is not first))

    def _config(self, node: RabbitNode, join: bool) -> str:
        """The node's configuration, in the classic format (read about 0.4 s sooner than a rabbitmq.conf,
        which goes through cuttlefish's schemas first).

        A node to `join` names the first node as its peer: it joins it while it boots, the first time
        (once it has a database of its own, a node rejoins its cluster by itself). Booting the three
        at once and joining them afterwards (`rabbitmqctl stop_app`, `join_cluster`, `start_app`)
        took 13.5 s here instead of 8.5 s, each start_app booting RabbitMQ's application again. A
        joining node retries its peer until the first node's database runs, as long as a start may last.
        """
        settings = [
            f'{{tcp_listeners, [{{"{LOCALHOST}", {node.amqp_port}}}]}}',
            "{log, [{console, [{enabled, false}]}]}",  # the file in RABBITMQ_LOG_BASE is enough
        ]
        if join:
            retries = int(self.timeout_s / JOIN_RETRY_S) + 1
            settings += [
                f"{{cluster_nodes, {{['{self.nodes[0].name}'], disc}}}}",
                "{cluster_formation, ["
                f"{{discovery_retry_limit, {retries}}}, {{discovery_retry_interval, {int(JOIN_RETRY_S * 1000)}}}]}}",
            ]
        return f"[{{rabbit, [{', '.join(settings)}]}}].\n"

    def _env(self, node: RabbitNode | None = None) -> dict[str, str]:
        """The environment of rabbitmqctl (no `node`) or of a node's server: nothing from /etc/rabbitmq."""
        data = self.root / "data"
        env = {name: value for name, value in os.environ.items() if not name.startswith(("RABBITMQ_", "ERL_"))}
        env |= {
            "HOME": str(self.home),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": LOCALHOST,
            "RABBITMQ_CONF_ENV_FILE": str(data / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(data / "enabled_plugins"),
            "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",  # rabbitmqctl's own listener
        }
        if node is None:
            return env
        dist = f"-kernel inet_dist_listen_min {node.dist_port} -kernel inet_dist_listen_max {node.dist_port}"
        return env | {
            "RABBITMQ_NODENAME": node.name,
            "RABBITMQ_NODE_IP_ADDRESS": LOCALHOST,
            "RABBITMQ_NODE_PORT": str(node.amqp_port),
            "RABBITMQ_DIST_PORT": str(node.dist_port),
            "RABBITMQ_SERVER_START_ARGS": f"{dist} -kernel inet_dist_use_interface {{127,0,0,1}}",
            "RABBITMQ_MNESIA_BASE": str(node.data / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node.logs),
            "RABBITMQ_CONFIG_FILE": str(node.data / "rabbitmq.config"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(node.data / "advanced.config"),
            "RABBITMQ_PID_FILE": str(node.data / "beam.pid"),
        }

    def _start_epmd(self) -> None:
        """An epmd on a port of the cluster's own (a node would otherwise start one that outlives it)."""
        output = (self.root / "logs" / "epmd.log").open("ab")
        with output:
            self._epmd = subprocess.Popen(
                [str(EPMD), "-port", str(self.epmd_port), "-address", LOCALHOST, "-relaxed_command_check"],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_until("epmd", lambda: _accepts(self.epmd_port), 10.0)

    def _spawn(self, node: RabbitNode) -> None:
        (node.data / "beam.pid").unlink(missing_ok=True)
        output = (node.logs / "server.out").open("ab")
        with output:  # the child keeps its own descriptor
            node.process = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                env=self._env(node),
                cwd=node.data,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_answering(self, node: RabbitNode) -> None:
        def answers() -> bool:
            if not node.running:
                # its output ends with why it stopped ("init terminating in do_boot ..."); the log, with what led there
                output = node.logs / "server.out"
                raise ClusterError(f"{node.name} exited while starting (its log: {node.log}){_tail(output, lines=6)}")
            return _answers_amqp(node.amqp_port)

        _wait_until(f"{node.name} answering AMQP on port {node.amqp_port}", answers, self.timeout_s, node.log)

    def _wait_clustered(self, node: RabbitNode) -> None:
        """Until `node` sees every running node of the cluster running, itself included."""

        def clustered() -> bool:
            status = json.loads(self.rabbitmqctl("cluster_status", "--formatter", "json", node=node.name))
            return {each.name for each in self.nodes if each.running} <= set(status["running_nodes"])

        _wait_until(
            f"{node.name} running in the cluster", clustered, self.timeout_s, node.log, transient=(ClusterError,)
        )

    def _members_online(self, node: RabbitNode) -> bool:
        """Whether every quorum queue with a member on `node` has that member online."""
        vhosts = json.loads(self.rabbitmqctl("list_vhosts", "name", "--formatter", "json", node=node.name))
        for vhost in vhosts:
            arguments = ("list_queues", "-p", vhost["name"], "name", "type", "members", "online", "--formatter", "json")
            for queue in json.loads(self.rabbitmqctl(*arguments, node=node.name)):
                if queue["type"] == "quorum" and node.name in queue["members"] and node.name not in queue["online"]:
                    return False
        return True

    def _import_definitions(self, definitions: Mapping[str, object]) -> None:
        path = self.root / "data" / f"definitions-{secrets.token_hex(4)}.json"
        path.write_text(json.dumps(definitions))
        path.chmod(0o600)  # it holds passwords
        try:
            self.rabbitmqctl("import_definitions", str(path))
        finally:
            path.unlink()

    def _run(self, program: pathlib.Path, *arguments: str, node: str) -> str:
        command = [str(program), "-n", node, "--quiet", *arguments]
        try:
            done = subprocess.run(command, env=self._env(), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"{program.name} {arguments[0]} on {node}: no answer in {COMMAND_TIMEOUT_S} s") from None
        if done.returncode != 0:
            reason = (done.stderr or done.stdout).strip()
            raise ClusterError(f"{program.name} {' '.join(arguments)} on {node} failed:\n{reason}")
        return done.stdout

    def _beam_pid(self, node: RabbitNode) -> int:
        """The Erlang VM's pid: a child of the rabbitmq-server script, which waits for it."""
        pid_file = node.data / "beam.pid"
        if pid_file.exists() and (text := pid_file.read_text().strip()):
            return int(text)
        assert node.process is not None
        return next(iter(_children(node.process.pid)), node.process.pid)

    def _wait_exited(self, node: RabbitNode) -> None:
        assert node.process is not None
        try:
            node.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"{node.name} still runs {STOP_TIMEOUT_S} s after it was told to stop") from None

    def _kill_process(self, node: RabbitNode) -> None:
        if node.process is None:
            return
        if node.running:
            with contextlib.suppress(ProcessLookupError, ValueError, OSError):
                os.kill(self._beam_pid(node), signal.SIGKILL)
            try:  # the script reaps the VM: killed first, the VM would stay a zombie
                node.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait()


def _definitions(vhost: str, users: Mapping[str, tuple[str, tuple[str, ...]]]) -> dict[str, object]:
    """Definitions (as `rabbitmqctl import_definitions` reads them) of a vhost and users on it."""
    return {
        "vhosts": [{"name": vhost}],
        "users": [{"name": name, "password": password, "tags": []} for name, (password, _) in users.items()],
        "permissions": [
            {"user": name, "vhost": vhost, "configure": configure, "write": write, "read": read}
            for name, (_, (configure, write, read)) in users.items()
        ],
    }


def _answers_amqp(port: int) -> bool:
    """Whether a broker on `port` answers AMQP 0-9-1's protocol header with a frame (connection.start)."""
    try:
        with socket.create_connection((LOCALHOST, port), timeout=2) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1) == b"\x01"
    except OSError:
        return False


# -- PostgreSQL ---------------------------------------------------------------------------------


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
    """A PostgreSQL 15 primary and a synchronous hot standby on 127.0.0.1, swapped by a failover.

    Their data directories go to a directory of their own under /var/tmp, not under `workdir`:
    the server runs as the postgres OS user, who must reach them, and a caller's work directory
    may sit below directories closed to other users (pytest's are 0700); opening those up would
    open everything else below them too. /var/tmp is reachable by everyone and on disk. The
    servers' logs are copied into `workdir`/postgres when the pair is destroyed.
    """

    def __init__(self, workdir: pathlib.Path, *, timeout_s: float = START_TIMEOUT_S) -> None:
        self.logs = workdir / "postgres"
        self.root = pathlib.Path("/var/tmp") / f"castad-pg-{secrets.token_hex(6)}"
        self.timeout_s = timeout_s
        ports = _distinct_free_ports(2)
        self.nodes = tuple(PostgresNode(f"pg{i}", ports[i - 1], self.root / f"pg{i}") for i in (1, 2))
        self.primary, self.standby = self.nodes
        self._postmasters: set[int] = set()  # every one started, for the shared memory a killed one leaves

    def start(self) -> PostgresPair:
        """Make the primary, clone the standby from it, wait until the standby streams as `sync`."""
        _require_programs()
        started = time.monotonic()
        self.root.mkdir(mode=0o700)
        _give_to_postgres(self.root)
        self._as_postgres(
            [POSTGRES_BIN / "initdb", "-D", self.primary.data, "-U", "postgres", "--auth=trust"]
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
        hosts = "&".join(f"host={LOCALHOST}:{node.port}" for node in self.nodes)
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
            raise ClusterError(f"the primary {self.primary.name} is not running")
        os.kill(pid, signal.SIGSTOP)
        doomed = [pid, *_children(pid)]
        for each in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)
        _wait_until(f"{self.primary.name}'s processes gone", lambda: not any(map(_alive, doomed)), STOP_TIMEOUT_S)

    def stop_primary(self) -> None:
        """Stop the primary gracefully: it ships every WAL record to the standby before it exits."""
        self._pg_ctl(self.primary, "stop", "-m", "fast")

    def promote(self) -> None:
        """Make the standby the primary; it commits without waiting for a standby until one is rebuilt
        (as Patroni's non-strict synchronous mode does)."""
        if self._postmaster(self.primary) is not None:
            raise ClusterError(f"{self.primary.name} still runs: promoting would make two primaries")
        if self._postmaster(self.standby) is None:
            raise ClusterError(f"the standby {self.standby.name} is not running: there is nothing to promote")
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
            raise ClusterError(f"{self.standby.name} still runs: stop or kill it before it is rebuilt")
        started = time.monotonic()
        shutil.rmtree(self.standby.data, ignore_errors=True)
        self._clone_standby()
        log.info("postgresql: %s rebuilt as a standby in %.1f s", self.standby.name, time.monotonic() - started)

    def destroy(self) -> None:
        """Stop both servers at once, keep their logs in `workdir`/postgres, remove the rest."""
        for node in self.nodes:
            if self._postmaster(node) is not None:
                with contextlib.suppress(ClusterError):
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
        source = f"host={LOCALHOST} port={primary.port} user=postgres application_name={standby.name}"
        self._as_postgres(
            [POSTGRES_BIN / "pg_basebackup", "-D", standby.data, "-d", source, "-R", "-X", "stream"]
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

            _wait_until(f"{standby.name} streaming as sync", synchronous, self.timeout_s, standby.log)

    def _write_node_conf(self, node: PostgresNode) -> None:
        _write_as_postgres(node.data / "node.conf", f"port = {node.port}\n")

    def _pg_ctl(self, node: PostgresNode, action: str, *options: str) -> None:
        command = [POSTGRES_BIN / "pg_ctl", "-D", node.data, "-w", "-t", str(int(self.timeout_s)), *options]
        if action == "start":
            command += ["-l", node.log]
        self._as_postgres([*command, action], f"pg_ctl {action} of {node.name}", node.log)
        if action == "start" and (pid := self._postmaster(node)) is not None:
            self._postmasters.add(pid)

    def _as_postgres(self, command: Sequence[object], what: str, log_file: pathlib.Path | None = None) -> None:
        """Run a program as the postgres OS user (the server refuses to run as root)."""
        arguments = [str(RUNUSER), "-u", "postgres", "--", *map(str, command)]
        try:
            done = subprocess.run(arguments, cwd=self.root, capture_output=True, text=True, timeout=self.timeout_s + 10)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"{what}: not done in {self.timeout_s} s{_tail(log_file)}") from None
        if done.returncode != 0:
            raise ClusterError(f"{what} failed:\n{(done.stderr or done.stdout).strip()}{_tail(log_file)}")

    def _connect(self, node: PostgresNode) -> psycopg.Connection[tuple[object, ...]]:
        info = f"host={LOCALHOST} port={node.port} user=postgres dbname=postgres connect_timeout=5"
        return psycopg.connect(info, autocommit=True)

    def _postmaster(self, node: PostgresNode) -> int | None:
        """The pid of the node's running postmaster, if one runs (postmaster.pid's first line)."""
        try:
            pid = int((node.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None


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


# -- processes, ports and waiting ---------------------------------------------------------------


def _distinct_free_ports(count: int) -> list[int]:
    """`count` different free ports below the ephemeral range (`stack.free_port` picks each at random)."""
    ports: list[int] = []
    while len(ports) < count:
        if (port := stack.free_port()) not in ports:
            ports.append(port)
    return ports


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((LOCALHOST, port)) == 0


def _alive(pid: int) -> bool:
    """Whether `pid` runs: not gone, not a zombie (this machine's init does not reap orphans)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children(pid: int) -> list[int]:
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(proc.name))
    return found


def _wait_until(
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
    raise ClusterError(f"no {what} within {timeout_s:.0f} s{reason}{_tail(log_file)}")


def _tail(*paths: pathlib.Path | None, lines: int = 15) -> str:
    """The end of the first of `paths` that exists, to quote in an error."""
    for path in paths:
        if path is not None and path.exists():
            with path.open(errors="replace") as text:
                return f"\nthe end of {path}:\n" + "".join(collections.deque(text, maxlen=lines))
    return ""
