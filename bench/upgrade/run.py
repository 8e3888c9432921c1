"""A rolling upgrade from an earlier release to this one, with pipelines in flight, judged as a fault run is.

The installation is migrated to this release's schema first (the charts' hook Jobs run before any pod rolls), then
every service runs the earlier release. The services roll one group at a time in the order CHANGELOG.md gives
(relays, the gateway, then video, song and lyric), each as a Deployment with `maxUnavailable: 0` rolls: a replica
of the new release starts and turns ready, then one of the old release stops (SIGTERM, its stop grace). Each phase
of the rollout (every release mix it passes through) runs for a while under steady traffic: briefs, half of them with
uploaded photos, an operator cancelling and retrying, stage providers that fail a third of their calls. After the
last phase the traffic stops, every pipeline must end, and the fault checker's invariants judge the run (every
pipeline terminal, none lost, no effect twice, the order of each producer's events kept, no dead letter, no parked
row).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import pathlib
import re
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Mapping

import httpx
from castad_api import keys
from castad_contracts import topology
from castad_faults import checker, injections, plan, traffic
from castad_local import access, demo_photos
from castad_local import stack as stack_
from castad_local.fakes import suno
from castad_runtime import messaging, migrations
from castad_testkit import scratch

from bench.upgrade import releases

# CHANGELOG's order: the relays, the gateway, then the stages one at a time from the last of the pipeline to the first
# (a stage reads the files of the one before it, which a new release keeps where a release up to 0.2 cannot read).
GROUPS: tuple[tuple[str, ...], ...] = (
    (topology.RELAY,),
    (topology.GATEWAY,),
    *((stage,) for stage in reversed(topology.STAGES)),
)
# What each process's log says when it held work for another release, or handed work over to another replica.
HELD = {
    "event held: a version newer than it reads": re.compile(r"newer than \d+, the newest known here.*held"),
    "event held until its queue exists": re.compile(r"wait until queue .* exists"),
    "event held until a replica reads its version": re.compile(
        r"waits (for a replica of \w+ that reads|until no replica of \w+ that does not take)"
    ),
    "job left for a newer release": re.compile(r"left, untouched, for a replica of a newer release"),
    "attempt handed back by a stopping replica": re.compile(r"handed back \(worker_stopped\)"),
    "outbox lease handed to another relay": re.compile(r"lease of term \d+ handed back"),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    replicas: int  # of every service at rest; a roll adds one of the new release before it stops one of the old
    phase_s: float  # traffic in each mix of releases
    rate_per_s: float
    settle_s: float  # for every pipeline to end once the traffic stopped


SHORT = Settings(replicas=1, phase_s=4.0, rate_per_s=1.0, settle_s=120.0)
FULL = Settings(replicas=2, phase_s=45.0, rate_per_s=2.0, settle_s=300.0)


@dataclasses.dataclass
class Phase:
    """One mix of releases, and the pipelines accepted while it ran."""

    name: str
    running: dict[str, str]  # process -> the release it runs
    started: float = 0.0
    accepted: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Result:
    old: releases.Release
    new: releases.Release
    settings: Settings
    phases: list[Phase]
    outcomes: dict[str, str]  # pipeline -> how it ended
    held: dict[str, collections.Counter[str]]  # process -> what its log says it held or handed back
    findings: list[str]
    seconds: float


class Rollout:
    def __init__(self, old: releases.Release, new: releases.Release, settings: Settings, workdir: pathlib.Path):
        self.old, self.new, self.settings, self.workdir = old, new, settings, workdir
        self.namespace = f"upgrade-{scratch.RUN_ID}"
        self.topology = topology.Topology(self.namespace)
        self.urls = {
            svc: scratch.database_url(f"castad_upgrade_{scratch.RUN_ID}_{svc}") for svc in topology.WITH_DATABASE
        }
        self.music = suno.FakeSuno(song_s=plan.SONG_S, audio_s=2.0)
        self.artifacts_dir = workdir / "artifacts"
        self.stack = stack_.Stack(self.env(), workdir / "logs")
        self.release_of: dict[str, releases.Release] = {}  # process -> its release
        self.api_ports: dict[str, int] = {}  # the gateways that take traffic: ready, not stopping
        self._gateways_lock = threading.Lock()  # the traffic's threads read them while a roll changes them
        self.numbers: collections.Counter[str] = collections.Counter()

    def env(self) -> dict[str, str]:
        return {
            **plan.service_settings(self.music.url, suno.DEFAULT_KEY),
            "CASTAD_HOLD_EVENTS_S": "3600",  # an event one release cannot read waits for the other, as in production
            "CASTAD_AMQP_URL": scratch.AMQP_URL,
            "CASTAD_NAMESPACE": self.namespace,
            "CASTAD_ARTIFACTS_DIR": str(self.artifacts_dir),
            "CASTAD_RELAY_SOURCES": ",".join(f"{svc}={url}" for svc, url in self.urls.items()),
            **{f"CASTAD_{svc.upper()}_DATABASE_URL": url for svc, url in self.urls.items()},
        }

    @property
    def gateways(self) -> list[str]:
        with self._gateways_lock:
            return [f"http://127.0.0.1:{port}" for port in self.api_ports.values()]

    def install(self, cleanup: scratch.Cleanup) -> str:
        """Databases at this release's schema, the topology, the music API; an admin key."""
        self.music.start()
        cleanup.push("stop the music api", self.music.stop)
        cleanup.push("remove artifacts", lambda: shutil.rmtree(self.artifacts_dir, ignore_errors=True))
        for url in self.urls.values():
            cleanup.push(f"drop {url}", functools.partial(migrations.drop_database, url))
        cleanup.push("delete topology", lambda: messaging.delete_topology(scratch.AMQP_URL, self.topology))
        for line in stack_.prepare(self.env()):
            scratch.log.info("upgrade: %s", line)
        cleanup.push("stop services", self.stack.stop_all)
        return access.create_key("upgrade", frozenset(keys.Scope), "the upgrade test", self.env())

    def start(self, services: Iterable[str], release: releases.Release) -> None:
        """A replica of each of these services on `release`, started at once; back once each is ready (its
        /readyz, as the charts' readiness probe asks)."""
        started = [self._start(service, release) for service in services]
        for name, port in started:
            self.stack.wait_ready(f"http://127.0.0.1:{port}", timeout_s=120)
            if stack_.service_of(name) == topology.GATEWAY:  # in the load balancer once ready
                with self._gateways_lock:
                    self.api_ports[name] = port

    def _start(self, service: str, release: releases.Release) -> tuple[str, int]:
        self.numbers[service] += 1
        name = stack_.replica(service, self.numbers[service])
        port = stack_.free_port()
        extra = {"PYTHON": str(release.python)}
        if service == topology.GATEWAY:
            extra["CASTAD_API_PORT"] = str(port)
        else:
            extra[f"CASTAD_{service.upper()}_HEALTH_PORT"] = str(port)
        self.stack.start(name, extra)
        self.release_of[name] = release
        return name, port

    def stop(self, name: str) -> None:
        with self._gateways_lock:  # out of the load balancer first
            self.api_ports.pop(name, None)
        self.stack.stop(name, timeout_s=60)

    def running(self) -> dict[str, str]:
        return {name: self.release_of[name].name for name in self.stack.processes}

    def roll(self, services: tuple[str, ...]) -> Iterator[str]:
        """Roll these services to the new release a replica at a time, as `maxSurge: 1, maxUnavailable: 0` does.

        Yields each mix of releases it passes through, by name, and stays in it until asked for the next: a new
        replica beside the old ones, then one old replica fewer."""
        group = ", ".join(services)
        for step in range(1, self.settings.replicas + 1):
            self.start(services, self.new)
            yield f"{group}: {step} new beside {self.settings.replicas - step + 1} old"
            for service in services:
                self.stop(next(n for n in self.stack.processes if stack_.service_of(n) == service and self.is_old(n)))
            left = self.settings.replicas - step
            yield f"{group}: {step} new, {left} old" if left else f"{group}: all on the new release"

    def is_old(self, name: str) -> bool:
        return self.release_of[name] is self.old


def upload_photos(gateway: str, api_key: str) -> list[str]:
    """Three pictures uploaded as a client would: the ids a brief names them by."""
    ids = []
    with httpx.Client(base_url=gateway, timeout=30, headers={"Authorization": f"Bearer {api_key}"}) as http:
        for name, data in demo_photos.photos().items():
            answer = http.post("/v1/images", files={"file": (name, data, "image/jpeg")})
            answer.raise_for_status()
            ids.append(answer.json()["id"])
    return ids


def run(old_ref: str, settings: Settings, workdir: pathlib.Path) -> Result:
    began = time.monotonic()
    old, new = releases.install(old_ref), releases.this()
    rollout = Rollout(old, new, settings, workdir)
    cleanup = scratch.Cleanup()
    try:
        api_key = rollout.install(cleanup)
        tap = injections.Tap(rollout.topology, f"{rollout.namespace}.tap", keep=0, amqp_url=scratch.AMQP_URL)
        cleanup.push("close the tap", tap.close)
        rollout.start([topology.RELAY, *topology.STAGES, topology.GATEWAY] * settings.replicas, old)
        photos = upload_photos(rollout.gateways[0], api_key)
        submitter = SteadyTraffic(rollout, settings.rate_per_s, api_key, photos)
        operator = traffic.Operator(submitter, interval_s=max(2.0, settings.phase_s / 3))
        phases = [Phase(f"every service on {old.name}", rollout.running(), time.time())]
        submitter.start()
        operator.start()

        def stop_traffic() -> None:
            operator.stop()
            submitter.stop()

        cleanup.push("stop the traffic", stop_traffic)
        time.sleep(settings.phase_s)
        for group in GROUPS:
            for name in rollout.roll(group):
                phases.append(Phase(name, rollout.running(), time.time()))
                time.sleep(settings.phase_s)
        operator.stop()
        submitter.stop()
        ended_at = time.time()
        accepted = [done.pipeline_id for done in submitter.accepted]
        for done in submitter.accepted:
            phase = next(p for p in reversed(phases) if p.started <= done.accepted)
            phase.accepted.append(done.pipeline_id)
        outcomes = wait_ended(rollout.gateways[0], api_key, accepted, settings.settle_s)
        tap.close()
        snapshot = checker.collect(rollout.urls, rollout.topology.dead_letter_queue, scratch.AMQP_URL)
        expect = checker.Expectations(
            accepted=frozenset(accepted),
            poison=(),
            unroutable_event_ids=frozenset(),
            last_fault_end=ended_at,
            settle_s=settings.settle_s,
            artifacts_dir=rollout.artifacts_dir,
            routed=tuple(tap.routed),
        )
        findings = checker.Checker(snapshot, expect).run()
        for phase in phases:
            if not phase.accepted:
                findings.append(f"no pipeline was accepted while {phase.name}")
        held = {name: said_in(rollout.stack.log_dir / f"{name}.log") for name in rollout.release_of}
        return Result(old, new, settings, phases, outcomes, held, findings, time.monotonic() - began)
    finally:
        cleanup.run()


class SteadyTraffic(traffic.Submitter):
    """Briefs at a steady rate to whichever gateways run now; every other one names the uploaded photos."""

    def __init__(self, rollout: Rollout, rate_per_s: float, api_key: str, photos: list[str]) -> None:
        super().__init__(rollout.gateways, rate_per_s, f"upgrade-{scratch.RUN_ID}", api_key, photos=photos)
        self.rollout = rollout

    def targets(self) -> list[str]:
        return self.rollout.gateways or self.base_urls


def wait_ended(gateway: str, api_key: str, pipeline_ids: list[str], within_s: float) -> dict[str, str]:
    """How each pipeline ended, once all have or `within_s` passed (those still going: their status)."""
    deadline = time.monotonic() + within_s
    outcomes: dict[str, str] = {}
    with httpx.Client(base_url=gateway, timeout=10, headers={"Authorization": f"Bearer {api_key}"}) as http:
        while True:
            for pipeline_id in pipeline_ids:
                if outcomes.get(pipeline_id) not in checker.TERMINAL:
                    with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):  # asked again next round
                        outcomes[pipeline_id] = http.get(f"/v1/pipelines/{pipeline_id}").json()["status"]
            ended = len(outcomes) == len(pipeline_ids) and all(s in checker.TERMINAL for s in outcomes.values())
            if ended or time.monotonic() > deadline:
                return {pipeline_id: outcomes.get(pipeline_id, "unknown") for pipeline_id in pipeline_ids}
            time.sleep(1.0)


def said_in(log: pathlib.Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            for what, pattern in HELD.items():
                if pattern.search(line):
                    counts[what] += 1
    return counts


def outcomes_by_phase(result: Result) -> list[tuple[Phase, Mapping[str, int]]]:
    return [(phase, collections.Counter(result.outcomes[p] for p in phase.accepted)) for phase in result.phases]
