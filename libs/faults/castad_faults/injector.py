"""The injector: a deployment's parts killed, stopped, cut off and failed over, each fault waited out in turn.

It keeps the faults injected so far, and what the measures after the run need to know of them (`measures`).
The freezes whose moment has to be found first are in `freezes`.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import functools
import logging
import signal
import time
from collections.abc import Callable, Sequence

import psycopg
from castad_local import stack as stack_
from castad_local.fakes import suno
from castad_testkit import scratch

from castad_faults import counters, deployment, engines, injections, outage, outcome, plan

log = logging.getLogger("castad_faults")
DOWN_AFTER_KILL_S = 1.0
WORKS_AGAIN_S = 60.0  # the longest wait for the part a fault hit to work again before the next fault goes on
CUT_OFF_S = 10.0  # the least a node stays cut off: over two heartbeats, so the services find it rather than the heal
LONG_SONG_S = 60.0  # a song this long keeps ffmpeg busy long enough to be caught mid-render
# Work done in one service's database since a moment: a row of its outbox published, an event of its inbox handled.
WORKED = (
    "SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at > %(since)s),"
    " EXISTS (SELECT 1 FROM inbox WHERE received_at > %(since)s)"
)


class Injector:
    """Faults injected into a deployment one after another, each waited out before the next."""

    def __init__(self, chosen: plan.Plan, deployed: deployment.Deployment, counted: counters.Counters) -> None:
        self.plan = chosen
        self.deployment = deployed
        self.stack = deployed.stack
        self.topology = deployed.topology
        self.urls = deployed.urls
        self.counters = counted
        self.faults: list[outcome.Fault] = []
        self.sigterm: tuple[str, list[int]] = ("", [])  # the pipeline whose render was stopped, surviving ffmpegs
        self.frozen_job = ("", "", "", 0)  # stage, job, worker and attempt a frozen replica held
        self.probes: list[str] = []  # outbox rows added for the relay to park (each parked once, told once)
        self.frozen_refusal = ""  # the one of them a relay was stopped parking

    def record(
        self,
        kind: str,
        target: str,
        inject: Callable[[], object],
        last_s: float,
        heal: Callable[[], object],
        *,
        detail: str = "",
        takeover_bound_s: float | None = None,
    ) -> outcome.Fault:
        return self.together([(kind, target, inject, heal)], last_s, detail=detail, takeover_bound_s=takeover_bound_s)[
            0
        ]

    def together(
        self,
        each: Sequence[tuple[str, str, Callable[[], object], Callable[[], object]]],
        last_s: float,
        *,
        detail: str = "",
        takeover_bound_s: float | None = None,
    ) -> list[outcome.Fault]:
        """Inject each (kind, target, inject, heal) at once, heal each after `last_s`, then wait for the parts."""
        faults = []
        for kind, target, inject, _ in each:
            faults.append(outcome.Fault(kind, target, time.time(), detail=detail, takeover_bound_s=takeover_bound_s))
            log.info("faults: %s of %s", kind, target)
            inject()
        time.sleep(last_s)
        for fault, (_, _, _, heal) in zip(faults, each, strict=True):
            heal()
            fault.ended = time.time()
        self.faults += faults
        self.after(faults)
        return faults

    def after(self, faults: list[outcome.Fault]) -> None:
        """Wait until every part the faults hit works again (at most WORKS_AGAIN_S), then `quiet_s` of traffic."""
        deadline = time.monotonic() + WORKS_AGAIN_S
        for fault in faults:
            while not self._works_since(fault.target, fault.ended) and time.monotonic() < deadline:
                time.sleep(0.1)
        time.sleep(self.plan.quiet_s)

    def _works_since(self, target: str, since: float) -> bool:
        """Whether the part a fault hit did work after `since`, as `measures.recovery` measures it (read live)."""
        service = stack_.service_of(target)
        worked = {url_service: self._worked(url, since) for url_service, url in self.urls.items()}
        published = any(published for published, _ in worked.values())
        if service == "relay":
            return published
        if service in worked:
            return worked[service][1]
        return published and any(handled for _, handled in worked.values())

    @staticmethod
    def _worked(url: str, since: float) -> tuple[bool, bool]:
        """(an outbox row published, an event received) in this database after `since`; neither while it is out."""
        at = dt.datetime.fromtimestamp(since, dt.UTC)
        try:
            with psycopg.connect(scratch.dsn(url), connect_timeout=5) as conn:
                row = conn.execute(WORKED, {"since": at}).fetchone()
        except psycopg.OperationalError:  # a standby being promoted, say: asked again at the next look
            return False, False
        assert row is not None
        return bool(row[0]), bool(row[1])

    def _start_again(self, name: str) -> None:
        self.deployment.start_process(name)
        self.counters.restarted(name)

    def _restart(self, name: str) -> None:
        self._start_again(name)
        self.deployment.wait_ready(name)

    def kill_and_restart(self, names: list[str]) -> None:
        """kill -9 of each process, together or one after another as the plan says; each started again.

        Started, not waited for: the processes start side by side, and `after` waits until each works again.
        """
        kills = [
            ("kill -9", name, functools.partial(self.stack.kill, name), functools.partial(self._start_again, name))
            for name in names
        ]
        for group in [kills] if self.plan.together else [[kill] for kill in kills]:
            self.together(group, DOWN_AFTER_KILL_S)
            for _, name, _, _ in group:  # each process started again, not only its service working on
                self.deployment.wait_ready(name)
            self.stack.check_alive()

    def stop_video_mid_render(self) -> None:
        """SIGTERM to a video replica's process group while its ffmpeg renders a long song.

        The music API makes the next ten songs last LONG_SONG_S: some fail their attempts, as every provider call
        may.
        """
        self.deployment.music.plan(*[suno.Plan(audio_s=LONG_SONG_S)] * 10)
        deadline = time.monotonic() + 300
        while True:
            long = [
                (name, pid, pipeline_id)
                for name, pid in self.deployment.ffmpeg_renders()
                if injections.song_seconds_of(pid) > LONG_SONG_S / 4
                and (pipeline_id := injections.pipeline_of(pid)) is not None
            ]
            if long:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("no long render seen within 300 s")
            time.sleep(0.02)
        name, _, pipeline_id = long[0]
        fault = outcome.Fault("SIGTERM mid-render", name, time.time())
        video = self.stack.processes[name]
        self.stack.signal(name, signal.SIGTERM)
        video.wait(60)
        self.stack.processes.pop(name)
        survivors = [pid for replica, pid, _ in long if replica == name and engines.alive(pid)]
        self.sigterm = (pipeline_id, survivors)
        self._restart(name)
        fault.ended = time.time()
        self.faults.append(fault)
        self.after([fault])

    def database_outages(self, services: list[str]) -> None:
        """Each service's database out for `outage_s`, together or one after another as the plan says."""
        outages = [
            (
                "database outage",
                service,
                functools.partial(outage.block, self.urls[service]),
                functools.partial(outage.unblock, self.urls[service]),
            )
            for service in services
        ]
        for group in [outages] if self.plan.together else [[each] for each in outages]:
            self.together(group, self.plan.outage_s)

    def broker(self, kind: str, how: str, last_s: float) -> None:
        proxies = self.deployment.proxies

        def inject() -> None:
            for each in proxies:
                getattr(each, how)()

        def heal() -> None:
            for each in proxies:
                each.restore()

        self.record(kind, "broker", inject, last_s, heal)

    def lose_the_queues_leader(self) -> str:
        """kill -9 of the RabbitMQ node that leads the lyric stage's queue, back after `node_down_s`."""
        rabbitmq = self.deployment.rabbitmq
        node = rabbitmq.leader_of(self.topology.queue("lyric"))
        self.record(
            "rabbitmq node killed",
            node,
            lambda: rabbitmq.kill(node),
            self.plan.node_down_s,
            lambda: rabbitmq.start_node(node),
            detail=f"leader of {self.topology.queue('lyric')}",
            takeover_bound_s=plan.NODE_TAKEOVER_S,
        )
        return node

    def stop_a_node(self, other_than: str) -> None:
        """A graceful stop (`rabbitmqctl stop`) of another node, back after `node_down_s`."""
        rabbitmq = self.deployment.rabbitmq
        node = next(each.name for each in rabbitmq.nodes if each.name != other_than)
        self.record(
            "rabbitmq node stopped",
            node,
            lambda: rabbitmq.stop(node),
            self.plan.node_down_s,
            lambda: rabbitmq.start_node(node),
            takeover_bound_s=plan.NODE_TAKEOVER_S,
        )

    def cut_off_a_node(self) -> None:
        """Cut the network to the node that leads the lyric stage's queue, closing nothing.

        Every byte is dropped (a lost machine, a partition): the services find out by their heartbeats and
        keepalives, not by a reset.
        """
        rabbitmq = self.deployment.rabbitmq
        node = rabbitmq.leader_of(self.topology.queue("lyric"))
        cut = self.deployment.proxies[[each.name for each in rabbitmq.nodes].index(node)]
        self.record(
            "rabbitmq node cut off",
            node,
            cut.blackhole,
            max(self.plan.node_down_s, CUT_OFF_S),
            cut.restore,
            detail="its proxy drops every byte",
            takeover_bound_s=plan.NODE_CUT_OFF_TAKEOVER_S,
        )

    def freeze_the_relay_leader(self) -> None:
        """SIGSTOP of the relay that leads the gateway's outbox, SIGCONT after `relay_freeze_s`."""
        with psycopg.connect(scratch.dsn(self.urls["api"])) as conn:
            row = conn.execute("SELECT holder, term FROM outbox_leader").fetchone()
        if row is None:
            raise RuntimeError("no relay leads the gateway's outbox")
        name = self.stack.process_of(row[0])
        self.record(
            "relay leader frozen",
            name,
            lambda: self.stack.signal(name, signal.SIGSTOP),
            self.plan.relay_freeze_s,
            lambda: self.stack.signal(name, signal.SIGCONT),
            detail=f"leader of the gateway's outbox, term {row[1]}",
            takeover_bound_s=plan.RELAY_TAKEOVER_S,
        )

    def lose_a_postgresql_standby(self) -> None:
        """kill -9 of a PostgreSQL standby, started again after `node_down_s`.

        Commits go on, acknowledged by the other standby: the harness commits a row of its own right after the kill,
        and its `takeover_s` is how long that commit took (a commit that waited for the lost standby would return
        only once it is back).
        """
        postgres = self.deployment.postgres
        node = postgres.standbys[0]  # the first named: the one commits would wait for, were the standbys in priority
        fault = outcome.Fault(outcome.STANDBY_LOSS, f"standby {node.name} on port {node.port}", time.time())
        fault.takeover_bound_s = plan.STANDBY_LOSS_COMMIT_S
        log.info("faults: %s of %s", fault.kind, fault.target)
        postgres.kill_standby(node)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            committed = pool.submit(self._commit, time.time())
            time.sleep(self.plan.node_down_s)
            postgres.start_standby(node)
            fault.takeover_s = committed.result()
        fault.ended = time.time()
        fault.detail = (
            f"started again after {self.plan.node_down_s:g} s; a commit right after its loss took"
            f" {fault.takeover_s:.2f} s"
        )
        self.faults.append(fault)
        self.after([fault])

    def _commit(self, since: float) -> float:
        """Commit a row of the harness's own on the primary: seconds from `since` until it returned."""
        with psycopg.connect(scratch.dsn(self.deployment.postgres.url("postgres")), autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS harness_commits (at timestamptz NOT NULL)")
            conn.execute("INSERT INTO harness_commits VALUES (now())")
        return time.time() - since

    def fail_over_postgresql(self) -> None:
        """kill -9 of the PostgreSQL primary.

        The standby with the most of its WAL is promoted `failover_after_s` later (its clock ahead of the old
        primary's), the other follows it, and the old primary is made a synchronous standby again.
        """
        postgres = self.deployment.postgres
        fault = outcome.Fault(outcome.FAILOVER, f"primary on port {postgres.primary_port()}", time.time())
        log.info("faults: %s", fault.kind)
        postgres.kill_primary()
        time.sleep(self.plan.failover_after_s)
        postgres.promote()
        fault.ended = time.time()  # the promotion: what a takeover is measured from
        fault.detail = (
            f"standby on port {postgres.primary_port()} promoted {self.plan.failover_after_s:g} s later,"
            f" its clock {plan.STANDBY_CLOCK_AHEAD_S:g} s ahead"
        )
        fault.takeover_bound_s = plan.FAILOVER_TAKEOVER_S
        postgres.rebuild_standby()
        self.faults.append(fault)
        self.after([fault])
