"""The local stack: the services of infra/local/Procfile, their databases and topology."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

import httpx
from castad_api import service as api_service
from castad_api import settings as api_settings
from castad_contracts import topology
from castad_lyric import service as lyric_service
from castad_runtime import links, messaging, migrations, settings
from castad_song import service as song_service
from castad_video import service as video_service
from pydantic import SecretStr

from castad_local import REPO_ROOT, quorum

PROCFILE = REPO_ROOT / "infra" / "local" / "Procfile"
# Where `make up` serves each service's /healthz, /readyz and /metrics, apart from the gateway's public port 8000
# as in the charts; infra/observability/prometheus.yml scrapes them there.
PROBE_PORTS = {"relay": 8001, "lyric": 8002, "song": 8003, "video": 8004, "api": 8005}
EPHEMERAL_PORTS = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range")


@dataclasses.dataclass(frozen=True)
class Database:
    service: str
    settings_class: type[Any]
    migrations_dir: pathlib.Path


DATABASES = (
    Database("api", api_settings.ApiSettings, api_service.MIGRATIONS),
    Database("lyric", lyric_service.LyricSettings, lyric_service.MIGRATIONS),
    Database("song", song_service.SongSettings, song_service.MIGRATIONS),
    Database("video", video_service.VideoSettings, video_service.MIGRATIONS),
)


def prepare(env: Mapping[str, str] | None = None) -> list[str]:
    """Create and migrate every service database, declare the topology. Returns what was done."""
    done = []
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        for database in DATABASES:
            config = database.settings_class()
            created = migrations.ensure_database(config.database_url)
            migrations.upgrade(config.database_url, database.migrations_dir)
            done.append(f"{database.service}: database {'created and ' if created else ''}migrated")
        common = settings.CommonSettings()
        topo = topology.Topology(common.namespace)
        try:
            messaging.declare_topology(common.amqp_url, topo)
        except messaging.TopologyMismatch:
            # Queues of an earlier version on this machine: moved over while no service consumes them.
            done += [f"rabbitmq: {line}" for line in quorum.move_to_quorum(common.amqp_url, topo)]
        done.append(f"rabbitmq: exchange, quorum queues and bindings of namespace {common.namespace!r} declared")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return done


def probe_env() -> dict[str, str]:
    """The variables that give each service of the local stack its PROBE_PORTS port."""
    return {f"CASTAD_{service.upper()}_HEALTH_PORT": str(port) for service, port in PROBE_PORTS.items()}


LINK_SECRET_FILE = REPO_ROOT / "var" / "local" / "link-secret"
LINK_SECRET_CHARS = 64


def link_env() -> dict[str, str]:
    """The gateway's link secret, made once for the local installation, and each signing stage's key from it.

    With them the gateway seals the photos a brief names and the video stage checks the seals (docs/security.md).
    Locally every process gets all of them: they all run as one user, so no key would be out of another's reach;
    a deployment gives each its own (`python -m castad_api link-secrets`)."""
    if not LINK_SECRET_FILE.exists() or len(LINK_SECRET_FILE.read_text().strip()) < LINK_SECRET_CHARS:
        LINK_SECRET_FILE.parent.mkdir(parents=True, exist_ok=True)
        LINK_SECRET_FILE.touch(mode=0o600)
        LINK_SECRET_FILE.write_text(secrets.token_hex(LINK_SECRET_CHARS // 2))
    root = LINK_SECRET_FILE.read_text().strip()
    return {"CASTAD_API_LINK_SECRET": root, **links.stage_keys(SecretStr(root))}


def free_port() -> int:
    """A free port on 127.0.0.1 for a service to listen on, below the kernel's ephemeral range.

    A port from binding port 0 is an ephemeral one: between closing that probe and the service
    binding it, another process's outgoing connection may take it (seen as "address already in
    use" while the services start and connect). Ports below the range are only ever taken on
    purpose.
    """
    first_ephemeral = int(EPHEMERAL_PORTS.read_text().split()[0]) if EPHEMERAL_PORTS.exists() else 32768
    candidates = range(10000, first_ephemeral)
    for port in random.sample(candidates, min(100, len(candidates))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between 10000 and {first_ephemeral}")


def commands() -> dict[str, str]:
    """Service name -> shell command, from the Procfile."""
    result = {}
    for line in PROCFILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, command = line.split(":", 1)
            result[name.strip()] = command.strip()
    return result


def replica(service: str, number: int) -> str:
    """The process name of a service's replica: `lyric-2`."""
    return f"{service}-{number}"


def service_of(name: str) -> str:
    """The service a process name runs: `lyric` for `lyric` and `lyric-2`."""
    service, _, number = name.rpartition("-")
    return service if service and number.isdigit() else name


def stop_group(process: subprocess.Popen[Any], timeout_s: float = 20.0) -> None:
    """SIGTERM to the process's group (started with start_new_session), SIGKILL if it has not ended in time."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class Stack:
    """Each service as its own process, started, stopped and killed one by one.

    A process is named by its service (`lyric`), or by a replica of it (`lyric-2`: the service's command
    under a name of its own, with the environment it is given)."""

    def __init__(self, env: Mapping[str, str], log_dir: pathlib.Path) -> None:
        self.env = {**os.environ, "PYTHON": sys.executable, **env}
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.commands = commands()

    def start(self, name: str, extra_env: Mapping[str, str] | None = None) -> None:
        command = self.commands[name if name in self.commands else service_of(name)]
        with (self.log_dir / f"{name}.log").open("ab") as log:  # the child keeps its own copy
            # `exec`: the service replaces the shell, so waiting for this process waits for the
            # service itself (a shell dies at once on SIGTERM and would leave it still stopping).
            self.processes[name] = subprocess.Popen(
                f"exec {command}",
                shell=True,
                env={**self.env, **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_all(self) -> None:
        for name in self.commands:
            self.start(name)

    def signal(self, name: str, sig: int) -> None:
        process = self.processes[name]
        if process.poll() is None:
            os.killpg(process.pid, sig)

    def stop(self, name: str, timeout_s: float = 20.0) -> None:
        process = self.processes.pop(name, None)
        if process is not None:
            stop_group(process, timeout_s)

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def kill_all(self) -> None:
        """SIGKILL every process group at once and reap each: for a stack whose way out nobody looks at."""
        processes = list(self.processes.values())
        self.processes.clear()
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in processes:
            process.wait()

    def stop_all(self, timeout_s: float = 20.0) -> None:
        """Stop every process at once: SIGTERM to each, then wait for each (SIGKILL if it has not ended in time)."""
        processes = [process for process in self.processes.values() if process.poll() is None]
        self.processes.clear()
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in processes:
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def process_of(self, worker: str) -> str:
        """The name of the running process a worker id names.

        A stage's worker id is `song@host:1234`, a relay's lease holder `relay@host:1234/ab12cd34`.
        """
        pid = int(worker.split("/", 1)[0].rsplit(":", 1)[1])
        for name, process in self.processes.items():
            if process.pid == pid:
                return name
        raise LookupError(f"no running process is worker {worker}")

    def check_alive(self) -> None:
        dead = {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"services exited: {dead}; logs in {self.log_dir}")

    def wait_ready(self, base_url: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"gateway at {base_url} not ready after {timeout_s} s; logs in {self.log_dir}")
