"""Three RabbitMQ nodes in one cluster on this machine, from Debian's rabbitmq-server.

Start them, lose one (kill -9 or a graceful stop), start it again, ask which node leads a quorum queue.

`RabbitCluster`: `start()`, `urls()`, `grant()`, `kill(node)`, `stop(node)`, `start_node(node)`,
`leader_of(queue)`, `destroy()` (see `engines` for what the engines share).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Mapping, Sequence

from castad_contracts import topology
from castad_local import privileges

from castad_faults import engines

log = engines.log


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

    def __init__(self, workdir: pathlib.Path, size: int = 3, *, timeout_s: float = engines.START_TIMEOUT_S) -> None:
        self.root = workdir / "rabbitmq"
        self.home = self.root / "data" / "home"
        self.timeout_s = timeout_s
        ports = engines.distinct_free_ports(2 * size + 1)
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
        """Boot the first node, then every other at once, each joining the first as it boots.

        The others wait for the first to answer: a node that joins while the first is still enabling
        its feature flags copies its tables in their older form, then fails its own schema check
        (`schema_integrity_check_failed`, `rabbit_user` without `limits`) and exits.

        Return once every node answers AMQP and the first sees them all running.
        """
        engines.require_programs()
        started = time.monotonic()
        self._write_files()
        self._start_epmd()
        first, *others = self.nodes
        self._spawn(first)
        self._wait_answering(first)
        for node in others:
            self._spawn(node)
        for node in others:
            self._wait_answering(node)
        self._wait_clustered(self.nodes[0])
        log.info("rabbitmq: %d nodes clustered in %.1f s", len(self.nodes), time.monotonic() - started)
        return self

    def urls(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> list[str]:
        """The AMQP URL of every node, in the order of `nodes` (guest may log in from 127.0.0.1 only)."""
        return [self.url(node.name, user, password, vhost) for node in self.nodes]

    def url(self, node: str, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        credentials = f"{urllib.parse.quote(user, safe='')}:{urllib.parse.quote(password, safe='')}"
        address = f"{engines.LOCALHOST}:{self._node(node).amqp_port}"
        return f"amqp://{credentials}@{address}/{urllib.parse.quote(vhost, safe='')}"

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

    def leader_of(self, queue: str, vhost: str = "/", timeout_s: float = 150.0) -> str:
        """The node that leads quorum queue `queue`, once its members agree on one.

        An election after its leader's loss takes a few seconds. Each look asks the next running node: one that
        does not answer (just started again, on a loaded host: a full run of `make test` once saw no answer in
        COMMAND_TIMEOUT_S) is not asked twice in a row, and the wait outlasts two such looks.
        """
        found: list[str] = []
        looks: list[int] = [0]
        status = ("quorum_status", queue, "--vhost", vhost, "--formatter", "json")

        def elected() -> bool:
            running = [node for node in self.nodes if node.running] or [self._any_running()]
            asked = running[looks[0] % len(running)]
            looks[0] += 1
            rows = json.loads(self._run(engines.RABBITMQ_BIN / "rabbitmq-queues", *status, node=asked.name))
            found[:] = [row["Node Name"] for row in rows if row.get("Raft State") == "leader"]
            return len(found) == 1

        engines.wait_until(f"a leader of quorum queue {queue!r}", elected, timeout_s, transient=(engines.ClusterError,))
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
            raise engines.ClusterError(f"{node} is not running")
        os.kill(self._beam_pid(target), signal.SIGKILL)
        self._wait_exited(target)

    def stop(self, node: str) -> None:
        """Stop the node gracefully (`rabbitmqctl stop`): it hands its queue leaderships over first."""
        target = self._node(node)
        self.rabbitmqctl("stop", node=target.name)
        self._wait_exited(target)

    def start_node(self, node: str) -> None:
        """Start a node that was killed or stopped.

        Return once it runs in the cluster again and every quorum queue it is a member of has it back online.
        """
        target = self._node(node)
        if target.running:
            raise engines.ClusterError(f"{node} is already running")
        started = time.monotonic()
        self._spawn(target)
        self._wait_answering(target)
        self._wait_clustered(target)
        engines.wait_until(
            f"{node}'s quorum queue members online",
            lambda: self._members_online(target),
            self.timeout_s,
            target.log,
            transient=(engines.ClusterError,),
        )
        log.info("rabbitmq: %s back in %.1f s", node, time.monotonic() - started)

    def rabbitmqctl(self, *arguments: str, node: str | None = None) -> str:
        """Run rabbitmqctl on `node` (by default a running one); its output."""
        return self._run(engines.RABBITMQ_BIN / "rabbitmqctl", *arguments, node=node or self._any_running().name)

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
        raise engines.ClusterError("no node of the cluster is running")

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
        """The node's configuration, in the classic format.

        It is read about 0.4 s sooner than a rabbitmq.conf, which goes through cuttlefish's schemas first.

        A node to `join` names the first node as its peer: it joins it while it boots, the first time
        (once it has a database of its own, a node rejoins its cluster by itself). Booting the three
        and joining them afterwards (`rabbitmqctl stop_app`, `join_cluster`, `start_app`) costs a
        second boot of RabbitMQ's application on each joining node. A joining node retries its peer
        until the first node's database runs, as long as a start may last.
        """
        settings = [
            f'{{tcp_listeners, [{{"{engines.LOCALHOST}", {node.amqp_port}}}]}}',
            "{log, [{console, [{enabled, false}]}]}",  # the file in RABBITMQ_LOG_BASE is enough
        ]
        if join:
            retries = int(self.timeout_s / engines.JOIN_RETRY_S) + 1
            settings += [
                f"{{cluster_nodes, {{['{self.nodes[0].name}'], disc}}}}",
                "{cluster_formation, ["
                f"{{discovery_retry_limit, {retries}}},"
                f" {{discovery_retry_interval, {int(engines.JOIN_RETRY_S * 1000)}}}]}}",
            ]
        return f"[{{rabbit, [{', '.join(settings)}]}}].\n"

    def _env(self, node: RabbitNode | None = None) -> dict[str, str]:
        """The environment of rabbitmqctl (no `node`) or of a node's server: nothing from /etc/rabbitmq."""
        data = self.root / "data"
        env = {name: value for name, value in os.environ.items() if not name.startswith(("RABBITMQ_", "ERL_"))}
        env |= {
            "HOME": str(self.home),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": engines.LOCALHOST,
            "RABBITMQ_CONF_ENV_FILE": str(data / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(data / "enabled_plugins"),
            "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",  # rabbitmqctl's own listener
        }
        if node is None:
            return env
        dist = f"-kernel inet_dist_listen_min {node.dist_port} -kernel inet_dist_listen_max {node.dist_port}"
        return env | {
            "RABBITMQ_NODENAME": node.name,
            "RABBITMQ_NODE_IP_ADDRESS": engines.LOCALHOST,
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
                [
                    str(engines.EPMD),
                    "-port",
                    str(self.epmd_port),
                    "-address",
                    engines.LOCALHOST,
                    "-relaxed_command_check",
                ],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        engines.wait_until("epmd", lambda: engines.accepts(self.epmd_port), 10.0)

    def _spawn(self, node: RabbitNode) -> None:
        (node.data / "beam.pid").unlink(missing_ok=True)
        output = (node.logs / "server.out").open("ab")
        with output:  # the child keeps its own descriptor
            node.process = subprocess.Popen(
                [str(engines.RABBITMQ_BIN / "rabbitmq-server")],
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
                raise engines.ClusterError(
                    f"{node.name} exited while starting (its log: {node.log}){engines.tail(output, lines=6)}"
                )
            return _answers_amqp(node.amqp_port)

        engines.wait_until(f"{node.name} answering AMQP on port {node.amqp_port}", answers, self.timeout_s, node.log)

    def _wait_clustered(self, node: RabbitNode) -> None:
        """Until `node` sees every running node of the cluster running, itself included."""

        def clustered() -> bool:
            status = json.loads(self.rabbitmqctl("cluster_status", "--formatter", "json", node=node.name))
            return {each.name for each in self.nodes if each.running} <= set(status["running_nodes"])

        engines.wait_until(
            f"{node.name} running in the cluster",
            clustered,
            self.timeout_s,
            node.log,
            transient=(engines.ClusterError,),
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
            done = subprocess.run(
                command, env=self._env(), capture_output=True, text=True, timeout=engines.COMMAND_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise engines.ClusterError(
                f"{program.name} {arguments[0]} on {node}: no answer in {engines.COMMAND_TIMEOUT_S} s"
            ) from None
        if done.returncode != 0:
            reason = (done.stderr or done.stdout).strip()
            raise engines.ClusterError(f"{program.name} {' '.join(arguments)} on {node} failed:\n{reason}")
        return done.stdout

    def _beam_pid(self, node: RabbitNode) -> int:
        """The Erlang VM's pid: a child of the rabbitmq-server script, which waits for it."""
        pid_file = node.data / "beam.pid"
        if pid_file.exists() and (text := pid_file.read_text().strip()):
            return int(text)
        assert node.process is not None
        return next(iter(engines.children(node.process.pid)), node.process.pid)

    def _wait_exited(self, node: RabbitNode) -> None:
        assert node.process is not None
        try:
            node.process.wait(engines.STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise engines.ClusterError(
                f"{node.name} still runs {engines.STOP_TIMEOUT_S} s after it was told to stop"
            ) from None

    def _kill_process(self, node: RabbitNode) -> None:
        if node.process is None:
            return
        if node.running:
            with contextlib.suppress(ProcessLookupError, ValueError, OSError):
                os.kill(self._beam_pid(node), signal.SIGKILL)
            try:  # the script reaps the VM: killed first, the VM would stay a zombie
                node.process.wait(engines.STOP_TIMEOUT_S)
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
        with socket.create_connection((engines.LOCALHOST, port), timeout=2) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1) == b"\x01"
    except OSError:
        return False
