"""What a fault run deploys on this one machine: every service in replicas, on clustered engines.

- RabbitMQ: three nodes in one cluster (`rabbitmq.RabbitCluster`). The services reach each node
  through a TCP proxy of the harness (`proxy.TcpProxy`), so that the network to the broker can be
  cut, stalled or partitioned while the nodes keep running; the harness's own tools go to the
  nodes directly.
- PostgreSQL: a primary and two standbys, a commit waiting for any one of them (`postgres.PostgresCluster`),
  the standbys' clocks `plan.STANDBY_CLOCK_AHEAD_S` ahead; every service's database on it, reached by
  multi-host URLs that follow a promotion.
- A music API for the song stage: the fake sunoapi.org server, in this process.
- `plan.REPLICAS` processes of every service (`lyric-1`, `lyric-2`, ...), each gateway on a port
  of its own, each worker with its probes and metrics on a port of its own.

Everything lives in databases, a namespace and a directory of its own, removed at the end.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import pathlib
import shutil
from collections.abc import Iterator

from castad_api import keys
from castad_contracts import topology
from castad_local import access
from castad_local import stack as stack_
from castad_local.fakes import suno
from castad_runtime import messaging, migrations
from castad_testkit import scratch

from castad_faults import injections, plan, postgres, proxy, rabbitmq

log = logging.getLogger("castad_faults.deployment")

SERVICES = topology.WITH_DATABASE
PROCESSES = (*topology.STAGES, topology.GATEWAY, topology.RELAY)  # in the order their replicas are killed


class Deployment:
    def __init__(self, workdir: pathlib.Path, cleanup: scratch.Cleanup, keep: bool = False) -> None:
        self.workdir = workdir
        self.cleanup = cleanup
        self.keep = keep  # leave the databases, queues and files for a look afterwards
        self.namespace = f"faults-{scratch.RUN_ID}"
        self.topology = topology.Topology(self.namespace)
        self.rabbitmq = rabbitmq.RabbitCluster(workdir)
        self.postgres = postgres.PostgresCluster(
            workdir, standbys=plan.POSTGRES_STANDBYS, clock_ahead_s=plan.STANDBY_CLOCK_AHEAD_S
        )
        self.proxies = [proxy.TcpProxy(proxy.address_of(url)) for url in self.rabbitmq.urls()]
        self.music = suno.FakeSuno(song_s=plan.SONG_S, audio_s=2.0, listed_after_s=plan.SONG_LISTED_AFTER_S)
        self.artifacts_dir = workdir / "artifacts"
        self.urls = {svc: self.postgres.url(f"castad_faults_{svc}") for svc in SERVICES}
        self.api_ports = [stack_.free_port() for _ in range(plan.REPLICAS)]
        self.probe_ports = {name: stack_.free_port() for name in self.names() if stack_.service_of(name) != "api"}
        self.stack = stack_.Stack(self.env(self.services_amqp_url), workdir / "logs")
        self.api_key = ""  # an admin key, made with the databases

    @property
    def amqp_url(self) -> str:
        """Every node, directly: the harness's own way to the broker."""
        return ",".join(self.rabbitmq.urls())

    @property
    def services_amqp_url(self) -> str:
        """Every node through its proxy: the services' way to the broker."""
        return ",".join(
            proxy.through(url, each.port) for url, each in zip(self.rabbitmq.urls(), self.proxies, strict=True)
        )

    @property
    def gateways(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.api_ports]

    def env(self, amqp_url: str) -> dict[str, str]:
        return {
            **plan.service_settings(self.music.url, suno.DEFAULT_KEY),
            "CASTAD_AMQP_URL": amqp_url,
            "CASTAD_NAMESPACE": self.namespace,
            "CASTAD_ARTIFACTS_DIR": str(self.artifacts_dir),
            "CASTAD_RELAY_SOURCES": ",".join(f"{svc}={url}" for svc, url in self.urls.items()),
            **{f"CASTAD_{svc.upper()}_DATABASE_URL": url for svc, url in self.urls.items()},
        }

    @staticmethod
    def names(service: str | None = None) -> list[str]:
        """The process names of every replica (of one service)."""
        services = (service,) if service else PROCESSES
        return [stack_.replica(svc, number) for svc in services for number in range(1, plan.REPLICAS + 1)]

    def replica_env(self, name: str) -> dict[str, str]:
        service = stack_.service_of(name)
        if service == "api":
            return {"CASTAD_API_PORT": str(self.api_ports[int(name.rsplit("-", 1)[1]) - 1])}
        return {f"CASTAD_{service.upper()}_HEALTH_PORT": str(self.probe_ports[name])}

    def metrics_endpoints(self) -> dict[str, str]:
        """Process name -> its /metrics, for the processes running now."""
        endpoints = {}
        for name in self.stack.processes:
            if stack_.service_of(name) == "api":
                endpoints[name] = f"http://127.0.0.1:{self.replica_env(name)['CASTAD_API_PORT']}/metrics"
            else:
                endpoints[name] = f"http://127.0.0.1:{self.probe_ports[name]}/metrics"
        return endpoints

    # -- the whole deployment

    def start(self) -> None:
        self.cleanup.push("destroy rabbitmq", self.rabbitmq.destroy)
        self.cleanup.push("destroy postgresql", self.postgres.destroy)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # each waits mostly on its own servers
            rabbitmq, postgres = pool.submit(self.rabbitmq.start), pool.submit(self.postgres.start)
            rabbitmq.result()
            postgres.result()
        self.music.start()
        self.cleanup.push("stop the music api", self.music.stop)
        if not self.keep:
            self.cleanup.push("remove artifacts", lambda: shutil.rmtree(self.artifacts_dir, ignore_errors=True))
        admin_env = self.env(self.amqp_url)
        for line in stack_.prepare(admin_env):
            log.info("faults: %s", line)
        if not self.keep:
            for url in self.urls.values():
                self.cleanup.push(f"drop {url}", functools.partial(migrations.drop_database, url))
            self.cleanup.push("delete topology", lambda: messaging.delete_topology(self.amqp_url, self.topology))
        self.api_key = access.create_key("faults", frozenset(keys.Scope), "the fault harness", admin_env)
        for each in self.proxies:
            each.start()
            self.cleanup.push("stop proxy", each.stop)
        self.cleanup.push("stop services", self.stack.stop_all)
        for name in self.names():
            self.start_process(name)
        for gateway in self.gateways:
            self.stack.wait_ready(gateway, timeout_s=120)

    def start_process(self, name: str) -> None:
        self.stack.start(name, self.replica_env(name))

    def wait_ready(self, name: str) -> None:
        """Wait until a gateway replica answers its readiness probe (other processes: nothing to wait for)."""
        if stack_.service_of(name) == "api":
            self.stack.wait_ready(f"http://127.0.0.1:{self.replica_env(name)['CASTAD_API_PORT']}", timeout_s=60)

    def ffmpeg_renders(self) -> Iterator[tuple[str, int]]:
        """(video replica, pid of an ffmpeg it runs) for every render under way."""
        for name in self.names("video"):
            process = self.stack.processes.get(name)
            if process is not None:
                for pid in injections.ffmpeg_children(process.pid):
                    yield name, pid
