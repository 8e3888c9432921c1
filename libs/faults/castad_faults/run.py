"""A fault run: the services under steady traffic, faults injected one after another, then the checker.

(The short plan kills a replica of every service at once, and takes every service's database out at once.)

The services run in replicas on clustered engines.

What runs where: `deployment.Deployment`. Faults, in order: kill -9 of a replica of each service,
SIGTERM to the video stage mid-render, poison messages and copies of real events, an outage of
each service's database, the broker's network cut, stalled and partitioned, then the loss of a
node: kill -9 of the RabbitMQ node that leads the queues, a graceful stop of another, the network
to one cut off without a word, a freeze (SIGSTOP) of the relay that leads the gateway's outbox, a
freeze of a song replica mid-attempt (before its submit) for longer than its lease, a freeze of a song replica,
of a gateway replica and of a relay each inside a transaction holding row locks for longer than such a session may
wait (the relay inside its park of a row it may not publish),
kill -9 of a PostgreSQL standby (commits go on), kill -9 of the PostgreSQL primary and the promotion of a standby
whose clock is ahead.

`python -m castad_faults [--short]` runs FULL (or SHORT) and writes docs/reports/faults.md.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import os
import pathlib
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import psycopg
from castad_local import stack as stack_
from castad_local.fakes import suno
from castad_testkit import handoffs, latency, scratch

from castad_faults import checker, counters, deployment, engines, injections, outage, plan, traffic

log = logging.getLogger("castad_faults")
SERVICES = deployment.SERVICES
PROCESSES = deployment.PROCESSES
DOWN_AFTER_KILL_S = 1.0
WORKS_AGAIN_S = 60.0  # the longest wait for the part a fault hit to work again before the next fault goes on
CUT_OFF_S = 10.0  # the least a node stays cut off: over two heartbeats, so the services find it rather than the heal
LONG_SONG_S = 60.0  # a song this long keeps ffmpeg busy long enough to be caught mid-render
FREEZE_TRIES = 20  # attempts seen before their submit, each stopped and let go again if it moved on meanwhile
# The target for pipelines no fault touches, while a row is parked: a speed target the report states as met or
# missed, not a finding (the time it takes follows the machine's speed, which the promise does not).
HANDOFF_P99_MS = 50.0
NODE_LOSS = (
    "rabbitmq node killed",
    "rabbitmq node stopped",
    "rabbitmq node cut off",
    "relay leader frozen",
    "stage replica frozen",
)
FAILOVER = "postgresql failover"
STANDBY_LOSS = "postgresql standby lost"
FROZEN_IN_TRANSACTION = "frozen inside a transaction"
# Stopped at a moment one of their sessions holds row locks. The relay is stopped otherwise: its sessions commit each
# statement on its own but for a refusal's, so it is stopped inside the refusal of a row the harness adds.
FROZEN_IN_TRANSACTION_SERVICES = ("song", "api")
REFUSAL_DUE_S = 1.0  # the row the relay is stopped on is due this long after it is added, once its lock is held
# The relay's session waits on that lock: whose it is (the row's lock held by the harness's own session).
WAITING_ON_THE_ROW = (
    "SELECT pid, application_name FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    " AND application_name LIKE 'castad:%%' AND %(holder)s = ANY(pg_blocking_pids(pid))"
)
IN_TRANSACTION_TRIES = 600  # stops of a process, each let go again at once if no session of its held row locks
# Sessions of Castad's processes inside a transaction that holds row locks (an id of their transaction: they wrote or
# locked a row); application_name is `castad:<pid>@<host>` (castad_runtime.db.application_name). A process is
# stopped only once one of its sessions is seen so (most of its transactions last milliseconds: stopped at random
# moments, a gateway replica took 300-600 stops to be caught inside one), and kept stopped if the session then waits
# for its next statement.
WRITING = (
    "SELECT pid, application_name, state FROM pg_stat_activity"
    " WHERE backend_xid IS NOT NULL AND application_name LIKE 'castad:%'"
)
# Work done in one service's database since a moment: a row of its outbox published, an event of its inbox handled.
WORKED = (
    "SELECT EXISTS (SELECT 1 FROM outbox WHERE published_at > %(since)s),"
    " EXISTS (SELECT 1 FROM inbox WHERE received_at > %(since)s)"
)


@dataclasses.dataclass
class Fault:
    kind: str
    target: str
    started: float
    ended: float = 0.0
    detail: str = ""
    recovered_s: float | None = None
    # The loss of a node: how soon another replica, node or host took over, and against what bound;
    # the longest pause of all work meanwhile; events the inboxes dropped as seen before.
    takeover_s: float | None = None
    takeover_bound_s: float | None = None
    paused_s: float | None = None
    duplicates: float | None = None
    submissions: str = ""


@dataclasses.dataclass
class Result:
    plan: plan.Plan
    started: float
    finished: float
    accepted: list[traffic.Accepted]
    quiet: list[traffic.Accepted]
    refusals: dict[str, int]
    faults: list[Fault]
    findings: list[str]
    snapshot: checker.Snapshot
    handoffs_ms: dict[str, latency.Summary]
    duplicates: int
    dropped: float  # events the inboxes dropped as seen before, over the whole run
    provider_tasks: int  # songs the music API was asked for, by its own count
    recorded_submissions: int  # submissions the song stage recorded before they left
    poison: list[injections.Poison]
    probes: list[str]  # outbox rows added for the relay to park
    actions: list[traffic.Action]

    @property
    def last_fault_end(self) -> float:
        """When the last fault (the failover) ended, on the databases' clock: what the pipelines' ends compare to."""
        return _on_the_databases_clock(max(fault.ended for fault in self.faults))

    @property
    def handoff_p99_ms(self) -> float | None:
        """None: not measured (a plan without a quiet phase)."""
        summary = self.handoffs_ms.get("stage handoff")
        return None if summary is None else summary["p99"]

    @property
    def handoff_target_met(self) -> bool | None:
        p99 = self.handoff_p99_ms
        return None if p99 is None else p99 <= HANDOFF_P99_MS


class FaultRun:
    def __init__(self, chosen: plan.Plan, workdir: pathlib.Path, cleanup: scratch.Cleanup, keep: bool = False) -> None:
        self.plan = chosen
        self.cleanup = cleanup
        self.deployment = deployment.Deployment(workdir, cleanup, keep)
        self.stack = self.deployment.stack
        self.topology = self.deployment.topology
        self.urls = self.deployment.urls
        self.faults: list[Fault] = []
        self.counters = counters.Counters(self.deployment.metrics_endpoints)
        self.sigterm: tuple[str, list[int]] = ("", [])  # the pipeline whose render was stopped, surviving ffmpegs
        self.frozen_job = ("", "", "", 0)  # stage, job, worker and attempt a frozen replica held
        self.provider_tasks = self.recorded_submissions = 0  # the music API's count, the song stage's
        self.probes: list[str] = []  # outbox rows added for the relay to park (each parked once, told once)
        self.frozen_refusal = ""  # the one of them a relay was stopped parking

    def run(self) -> Result:
        started = time.time()
        self.deployment.start()
        self.counters.start()
        self.cleanup.push("stop counting", self.counters.stop)
        tap = injections.Tap(
            self.topology, f"{self.topology.namespace}.tap", self.plan.duplicates, self.deployment.amqp_url
        )
        self.cleanup.push("close tap", tap.close)
        submitter = traffic.Submitter(
            self.deployment.gateways, self.plan.rate_per_s, f"faults-{scratch.RUN_ID}", self.deployment.api_key
        ).start()
        self.cleanup.push("stop traffic", submitter.stop)
        operator = traffic.Operator(submitter, self.plan.operator_interval_s).start()
        self.cleanup.push("stop the operator", operator.stop)
        self._until_a_pipeline_succeeded()

        self._kill_and_restart([deployment.Deployment.names(service)[0] for service in PROCESSES])
        self._stop_video_mid_render()
        poison = injections.poison_for(self.topology)
        injections.publish_poison(poison, self.deployment.amqp_url)
        duplicates = tap.republish()
        log.info("faults: %d poison messages and %d duplicates sent", len(poison), duplicates)
        self._database_outages(list(SERVICES))
        self._broker("connections cut", "cut", self.plan.broker_cut_s)
        self._broker("connections stalled", "hold", self.plan.broker_stall_s)
        if self.plan.partition_s:
            self._broker("network partition", "blackhole", self.plan.partition_s)
        leader = self._lose_the_queues_leader()
        self._stop_a_node(other_than=leader)
        self._cut_off_a_node()
        self._freeze_the_relay_leader()
        self._freeze_a_stage_replica_mid_attempt()
        self._freeze_inside_transactions()
        self._lose_a_postgresql_standby()
        self._fail_over_postgresql()
        while len(submitter.accepted) < self.plan.pipelines:
            time.sleep(1)
        operator.stop()
        submitter.stop()

        accepted = list(submitter.accepted)
        self._wait_terminal({a.pipeline_id for a in accepted}, self.faults[-1].ended + self.plan.settle_s)
        self.probes.append(injections.add_unroutable_row(self.urls["api"]))
        for probe in self.probes:
            self._wait_parked(probe)
        quiet = self._quiet_phase() if self.plan.quiet_pipelines else []
        tap.close()

        snapshot = checker.collect(self.urls, self.topology.dead_letter_queue, self.deployment.amqp_url)
        expect = checker.Expectations(
            accepted=frozenset(a.pipeline_id for a in accepted + quiet),
            poison=tuple(poison),
            unroutable_event_ids=frozenset(self.probes),
            # The last fault is the failover: the pipelines' ends after it are stamped by the promoted primary.
            last_fault_end=_on_the_databases_clock(self.faults[-1].ended),
            settle_s=self.plan.settle_s,
            artifacts_dir=self.deployment.artifacts_dir,
            routed=tuple(tap.routed),
        )
        findings = checker.Checker(snapshot, expect).run()
        findings += self._stopped_render(snapshot, operator.actions)
        self._recovery(snapshot)
        findings += self._takeovers(snapshot)
        findings += self._every_submission_recorded(snapshot)
        handoffs = self._handoffs({a.pipeline_id for a in quiet}) if quiet else {}
        return Result(
            plan=self.plan,
            started=started,
            finished=time.time(),
            accepted=accepted,
            quiet=quiet,
            refusals=dict(submitter.refusals),
            faults=self.faults,
            findings=findings,
            snapshot=snapshot,
            handoffs_ms=handoffs,
            duplicates=duplicates,
            dropped=self.counters.total(counters.DUPLICATES, time.time()),
            provider_tasks=self.provider_tasks,
            recorded_submissions=self.recorded_submissions,
            poison=poison,
            probes=list(self.probes),
            actions=list(operator.actions),
        )

    # -- faults ---------------------------------------------------------------------------------

    def _record(
        self,
        kind: str,
        target: str,
        inject: Callable[[], object],
        last_s: float,
        heal: Callable[[], object],
        *,
        detail: str = "",
        takeover_bound_s: float | None = None,
    ) -> Fault:
        return self._together([(kind, target, inject, heal)], last_s, detail=detail, takeover_bound_s=takeover_bound_s)[
            0
        ]

    def _together(
        self,
        each: Sequence[tuple[str, str, Callable[[], object], Callable[[], object]]],
        last_s: float,
        *,
        detail: str = "",
        takeover_bound_s: float | None = None,
    ) -> list[Fault]:
        """Inject each (kind, target, inject, heal) at once, heal each after `last_s`, then wait for the parts."""
        faults = []
        for kind, target, inject, _ in each:
            faults.append(Fault(kind, target, time.time(), detail=detail, takeover_bound_s=takeover_bound_s))
            log.info("faults: %s of %s", kind, target)
            inject()
        time.sleep(last_s)
        for fault, (_, _, _, heal) in zip(faults, each, strict=True):
            heal()
            fault.ended = time.time()
        self.faults += faults
        self._after(faults)
        return faults

    def _after(self, faults: list[Fault]) -> None:
        """Wait until every part the faults hit works again (at most WORKS_AGAIN_S), then `quiet_s` of traffic."""
        deadline = time.monotonic() + WORKS_AGAIN_S
        for fault in faults:
            while not self._works_since(fault.target, fault.ended) and time.monotonic() < deadline:
                time.sleep(0.1)
        time.sleep(self.plan.quiet_s)

    def _works_since(self, target: str, since: float) -> bool:
        """Whether the part a fault hit did work after `since`, as `_recovery` measures it (read live)."""
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

    def _until_a_pipeline_succeeded(self) -> None:
        """Before the first fault: the deployment did a whole pipeline (every part works)."""
        deadline = time.monotonic() + 120
        with psycopg.connect(scratch.dsn(self.urls["api"]), autocommit=True) as conn:
            while not conn.execute("SELECT 1 FROM pipelines WHERE status = 'SUCCEEDED' LIMIT 1").fetchone():
                if time.monotonic() > deadline:
                    raise RuntimeError("no pipeline succeeded within 120 s of the start")
                time.sleep(0.2)

    def _start_again(self, name: str) -> None:
        self.deployment.start_process(name)
        self.counters.restarted(name)

    def _restart(self, name: str) -> None:
        self._start_again(name)
        self.deployment.wait_ready(name)

    def _kill_and_restart(self, names: list[str]) -> None:
        """kill -9 of each process, together or one after another as the plan says; each started again.

        Started, not waited for: the processes start side by side, and `_after` waits until each works again.
        """
        kills = [
            ("kill -9", name, functools.partial(self.stack.kill, name), functools.partial(self._start_again, name))
            for name in names
        ]
        for group in [kills] if self.plan.together else [[kill] for kill in kills]:
            self._together(group, DOWN_AFTER_KILL_S)
            for _, name, _, _ in group:  # each process started again, not only its service working on
                self.deployment.wait_ready(name)
            self.stack.check_alive()

    def _stop_video_mid_render(self) -> None:
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
        fault = Fault("SIGTERM mid-render", name, time.time())
        video = self.stack.processes[name]
        self.stack.signal(name, signal.SIGTERM)
        video.wait(60)
        self.stack.processes.pop(name)
        survivors = [pid for replica, pid, _ in long if replica == name and engines.alive(pid)]
        self.sigterm = (pipeline_id, survivors)
        self._restart(name)
        fault.ended = time.time()
        self.faults.append(fault)
        self._after([fault])

    def _database_outages(self, services: list[str]) -> None:
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
            self._together(group, self.plan.outage_s)

    def _broker(self, kind: str, how: str, last_s: float) -> None:
        proxies = self.deployment.proxies

        def inject() -> None:
            for each in proxies:
                getattr(each, how)()

        def heal() -> None:
            for each in proxies:
                each.restore()

        self._record(kind, "broker", inject, last_s, heal)

    def _lose_the_queues_leader(self) -> str:
        """kill -9 of the RabbitMQ node that leads the lyric stage's queue, back after `node_down_s`."""
        rabbitmq = self.deployment.rabbitmq
        node = rabbitmq.leader_of(self.topology.queue("lyric"))
        self._record(
            "rabbitmq node killed",
            node,
            lambda: rabbitmq.kill(node),
            self.plan.node_down_s,
            lambda: rabbitmq.start_node(node),
            detail=f"leader of {self.topology.queue('lyric')}",
            takeover_bound_s=plan.NODE_TAKEOVER_S,
        )
        return node

    def _stop_a_node(self, other_than: str) -> None:
        """A graceful stop (`rabbitmqctl stop`) of another node, back after `node_down_s`."""
        rabbitmq = self.deployment.rabbitmq
        node = next(each.name for each in rabbitmq.nodes if each.name != other_than)
        self._record(
            "rabbitmq node stopped",
            node,
            lambda: rabbitmq.stop(node),
            self.plan.node_down_s,
            lambda: rabbitmq.start_node(node),
            takeover_bound_s=plan.NODE_TAKEOVER_S,
        )

    def _cut_off_a_node(self) -> None:
        """Cut the network to the node that leads the lyric stage's queue, closing nothing.

        Every byte is dropped (a lost machine, a partition): the services find out by their heartbeats and
        keepalives, not by a reset.
        """
        rabbitmq = self.deployment.rabbitmq
        node = rabbitmq.leader_of(self.topology.queue("lyric"))
        cut = self.deployment.proxies[[each.name for each in rabbitmq.nodes].index(node)]
        self._record(
            "rabbitmq node cut off",
            node,
            cut.blackhole,
            max(self.plan.node_down_s, CUT_OFF_S),
            cut.restore,
            detail="its proxy drops every byte",
            takeover_bound_s=plan.NODE_CUT_OFF_TAKEOVER_S,
        )

    def _freeze_the_relay_leader(self) -> None:
        """SIGSTOP of the relay that leads the gateway's outbox, SIGCONT after `relay_freeze_s`."""
        with psycopg.connect(scratch.dsn(self.urls["api"])) as conn:
            row = conn.execute("SELECT holder, term FROM outbox_leader").fetchone()
        if row is None:
            raise RuntimeError("no relay leads the gateway's outbox")
        name = self.stack.process_of(row[0])
        self._record(
            "relay leader frozen",
            name,
            lambda: self.stack.signal(name, signal.SIGSTOP),
            self.plan.relay_freeze_s,
            lambda: self.stack.signal(name, signal.SIGCONT),
            detail=f"leader of the gateway's outbox, term {row[1]}",
            takeover_bound_s=plan.RELAY_TAKEOVER_S,
        )

    def _freeze_a_stage_replica_mid_attempt(self) -> None:
        """SIGSTOP a song replica in an attempt not yet submitted, for longer than its lease; then SIGCONT.

        The attempt has not submitted its work to the music API yet. Another replica takes the attempt over and
        submits; the frozen one, woken, must send nothing (its fence).
        """
        job_id, worker, attempt, name = self._stop_a_song_replica_before_its_submit()
        self.frozen_job = ("song", job_id, worker, attempt)
        self._record(
            "stage replica frozen",
            name,
            lambda: None,  # stopped already, once its attempt was seen still before its submit
            plan.STAGE_FREEZE_S,
            lambda: self.stack.signal(name, signal.SIGCONT),
            detail=f"song job {job_id}, attempt {attempt}, before its submit",
            takeover_bound_s=plan.STAGE_FREEZE_S,  # another replica took the job over before the wake-up
        )

    def _stop_a_song_replica_before_its_submit(self) -> tuple[str, str, int, str]:
        """SIGSTOP the song replica of an attempt before its submit: the job, worker, attempt and process.

        The attempt may end or submit between the look and the signal (an injected failure ends it as its latency
        ends), or the replica may stop inside a transaction on the job's row (recording that failure): then it
        goes on and another attempt is chosen. Such a freeze is a fault of its own (`_freeze_inside_transactions`):
        this one measures the takeover of an attempt by its lease.
        """
        with psycopg.connect(scratch.dsn(self.urls["song"]), autocommit=True) as conn:
            for _ in range(FREEZE_TRIES):
                job_id, worker, attempt = self._song_attempt_before_its_submit()
                name = self.stack.process_of(worker)
                self.stack.signal(name, signal.SIGSTOP)
                if self._still_before_its_submit(conn, job_id, worker, attempt):
                    return job_id, worker, attempt, name
                self.stack.signal(name, signal.SIGCONT)
        raise RuntimeError(f"no song attempt stopped before its submit in {FREEZE_TRIES} tries")

    @staticmethod
    def _still_before_its_submit(conn: psycopg.Connection[Any], job_id: str, worker: str, attempt: int) -> bool:
        """Whether the attempt is still under way with nothing submitted, its job's row locked by no transaction."""
        try:
            with conn.transaction():
                row = conn.execute(
                    "SELECT 1 FROM jobs j JOIN attempts a ON a.job_id = j.id AND a.number = j.attempts"
                    " WHERE j.id = %s AND j.status = 'RUNNING' AND j.attempts = %s AND j.lease_owner = %s"
                    " AND j.handle IS NULL AND a.submitted_at IS NULL FOR UPDATE OF j NOWAIT",
                    (job_id, attempt, worker),
                ).fetchone()
        except psycopg.errors.LockNotAvailable:
            return False
        return row is not None

    def _song_attempt_before_its_submit(self) -> tuple[str, str, int]:
        """A song job, the worker and the number of its attempt under way that has no handle yet.

        Its work is about to be submitted: the fault injector's latency holds it there a moment.
        """
        deadline = time.monotonic() + 120
        with psycopg.connect(scratch.dsn(self.urls["song"]), autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT id, lease_owner, attempts FROM jobs WHERE status = 'RUNNING' AND handle IS NULL"
                    " AND lease_expires_at > now() + interval '1 second' ORDER BY lease_expires_at DESC LIMIT 1"
                ).fetchone()
                if row is not None:
                    return str(row[0]), str(row[1]), int(row[2])
                time.sleep(0.02)
        raise RuntimeError("no song attempt about to submit within 120 s")

    def _freeze_inside_transactions(self) -> None:
        """A replica of each of FROZEN_IN_TRANSACTION_SERVICES, and a relay, stopped inside a transaction holding rows.

        Each stays stopped longer than PostgreSQL lets a session wait idle inside a transaction: PostgreSQL ends its
        session, which lets go of its row locks, and the work that waited on them goes on; the process, woken, finds
        that connection gone and goes on as after an outage. The plan's `together` freezes them side by side, each
        found and let go on its own (each one's moment depends on the others' work going on).
        """
        stops: list[Callable[[], tuple[Fault, str, int]]] = [
            functools.partial(self._stop_inside_a_transaction, deployment.Deployment.names(service)[0])
            for service in FROZEN_IN_TRANSACTION_SERVICES
        ]
        stops.append(self._stop_a_relay_inside_a_refusal)
        batches = [stops] if self.plan.together else [[stop] for stop in stops]
        for batch in batches:
            with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
                frozen = list(pool.map(self._freeze_inside_a_transaction, batch))
            self.faults += frozen
            self._after(frozen)

    def _freeze_inside_a_transaction(self, stop: Callable[[], tuple[Fault, str, int]]) -> Fault:
        """Stop a process inside a transaction holding row locks for FROZEN_IN_TRANSACTION_S, then let it go on.

        `stop` stops it: the fault, and the database URL and backend pid of that session. Its `takeover_s`: from the
        stop until that session was ended.
        """
        fault, url, backend = stop()
        name = fault.target
        states: list[str] = []  # what the session did meanwhile, each change once
        with psycopg.connect(scratch.dsn(url), autocommit=True) as conn:
            while time.time() < fault.started + plan.FROZEN_IN_TRANSACTION_S:
                state = _session_state(conn, backend)
                if state is None and fault.takeover_s is None:
                    fault.takeover_s = time.time() - fault.started
                elif state is not None and state not in states:
                    states.append(state)
                time.sleep(0.1)
        self.stack.signal(name, signal.SIGCONT)
        fault.ended = time.time()
        ended = "more than the freeze" if fault.takeover_s is None else f"{fault.takeover_s:.1f} s"
        fault.detail += f"; the session was {', then '.join(states)}; it was ended after {ended}"
        return fault

    def _stop_inside_a_transaction(self, name: str) -> tuple[Fault, str, int]:
        """Stop the process `name` at a moment a session of its holds row locks inside a transaction.

        Stopped, then let go again at once if none does, until one does. The fault, and the database URL and backend
        pid of that session.
        """
        group = self.stack.processes[name].pid
        service = stack_.service_of(name)
        urls = dict(self.urls) if service == "relay" else {service: self.urls[service]}
        with contextlib.ExitStack() as opened:
            conns = {
                db: opened.enter_context(psycopg.connect(scratch.dsn(url), autocommit=True)) for db, url in urls.items()
            }
            deadline = time.monotonic() + WORKS_AGAIN_S
            tries = 0
            while tries < IN_TRANSACTION_TRIES and time.monotonic() < deadline:
                if not self._writing(conns, group):
                    time.sleep(0.005)
                    continue
                tries += 1
                self.stack.signal(name, signal.SIGSTOP)
                started, held = time.time(), None
                try:
                    time.sleep(0.05)  # a statement it had sent ends; its session then waits for the next
                    held = next((s for s in self._writing(conns, group) if s[2] == "idle in transaction"), None)
                finally:
                    if held is None:
                        self.stack.signal(name, signal.SIGCONT)
                if held is not None:
                    database, backend, _ = held
                    detail = f"its session {backend} in the {database} database held row locks ({tries} tries)"
                    log.info("faults: %s of %s: %s", FROZEN_IN_TRANSACTION, name, detail)
                    fault = Fault(FROZEN_IN_TRANSACTION, name, started, detail=detail)
                    fault.takeover_bound_s = plan.IN_TRANSACTION_RELEASE_S
                    return fault, urls[database], backend
        raise RuntimeError(
            f"{name} held no row locks at any of {tries} stops (at most {IN_TRANSACTION_TRIES}, or {WORKS_AGAIN_S:g} s)"
        )

    @staticmethod
    def _writing(conns: Mapping[str, psycopg.Connection[Any]], group: int) -> list[tuple[str, int, str]]:
        """Sessions (database, backend pid, state) of the process group `group` in transactions holding row locks."""
        return [
            (database, backend, state)
            for database, conn in conns.items()
            for backend, application, state in conn.execute(WRITING).fetchall()
            if _process_group(application) == group
        ]

    def _stop_a_relay_inside_a_refusal(self) -> tuple[Fault, str, int]:
        """Stop the relay that refuses a row of the gateway's outbox inside its refusal's transaction.

        The harness adds a row no service may publish (due a moment later) and locks it. The relay leading that
        outbox tells the operators, then waits on the lock to park it: it is stopped (SIGSTOP) there, and the lock let
        go. Its statement then parks the row, and its session holds that row's lock idle in the transaction: the
        relay that takes the outbox over must not park the row twice, nor tell the operators twice.
        """
        url = self.urls["api"]
        probe = injections.add_unroutable_row(url, due_in_s=REFUSAL_DUE_S)
        self.probes.append(probe)
        self.frozen_refusal = probe
        with psycopg.connect(scratch.dsn(url), autocommit=True) as watcher, psycopg.connect(scratch.dsn(url)) as holder:
            holder.execute("SELECT 1 FROM outbox WHERE event_id = %s FOR UPDATE", (probe,))
            holder_pid = holder.info.backend_pid
            deadline = time.monotonic() + WORKS_AGAIN_S
            while time.monotonic() < deadline:
                for backend, application in watcher.execute(WAITING_ON_THE_ROW, {"holder": holder_pid}).fetchall():
                    group = _process_group(application)
                    name = next((n for n, process in self.stack.processes.items() if process.pid == group), "")
                    if stack_.service_of(name) != "relay":
                        continue
                    self.stack.signal(name, signal.SIGSTOP)
                    started = time.time()
                    holder.rollback()  # the lock let go: the stopped relay's statement parks the row
                    detail = f"its session {backend} waited to park the row {probe} the harness had locked"
                    log.info("faults: %s of %s: %s", FROZEN_IN_TRANSACTION, name, detail)
                    fault = Fault(FROZEN_IN_TRANSACTION, name, started, detail=detail)
                    fault.takeover_bound_s = plan.IN_TRANSACTION_RELEASE_S
                    return fault, url, backend
                time.sleep(0.02)
        raise RuntimeError(f"no relay waited to park the row {probe} within {WORKS_AGAIN_S:g} s")

    def _lose_a_postgresql_standby(self) -> None:
        """kill -9 of a PostgreSQL standby, started again after `node_down_s`.

        Commits go on, acknowledged by the other standby: the harness commits a row of its own right after the kill,
        and its `takeover_s` is how long that commit took (a commit that waited for the lost standby would return
        only once it is back).
        """
        postgres = self.deployment.postgres
        node = postgres.standbys[0]  # the first named: the one commits would wait for, were the standbys in priority
        fault = Fault(STANDBY_LOSS, f"standby {node.name} on port {node.port}", time.time())
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
        self._after([fault])

    def _commit(self, since: float) -> float:
        """Commit a row of the harness's own on the primary: seconds from `since` until it returned."""
        with psycopg.connect(scratch.dsn(self.deployment.postgres.url("postgres")), autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS harness_commits (at timestamptz NOT NULL)")
            conn.execute("INSERT INTO harness_commits VALUES (now())")
        return time.time() - since

    def _fail_over_postgresql(self) -> None:
        """kill -9 of the PostgreSQL primary.

        The standby with the most of its WAL is promoted `failover_after_s` later (its clock ahead of the old
        primary's), the other follows it, and the old primary is made a synchronous standby again.
        """
        postgres = self.deployment.postgres
        fault = Fault(FAILOVER, f"primary on port {postgres.primary_port()}", time.time())
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
        self._after([fault])

    # -- waiting and measuring ------------------------------------------------------------------

    def _wait_terminal(self, pipeline_ids: set[str], deadline: float, poll_s: float = 1.0) -> None:
        while True:
            with psycopg.connect(scratch.dsn(self.urls["api"])) as conn:
                ended = conn.execute("SELECT id FROM pipelines WHERE status = ANY(%s)", (list(checker.TERMINAL),))
                done = {str(row[0]) for row in ended}
            left = pipeline_ids - done
            if not left or time.time() > deadline:
                log.debug("faults: %d of %d pipelines ended", len(pipeline_ids) - len(left), len(pipeline_ids))
                return
            time.sleep(poll_s)

    def _wait_parked(self, event_id: str) -> None:
        deadline = time.time() + 120
        with psycopg.connect(scratch.dsn(self.urls["api"])) as conn:
            while time.time() < deadline:
                row = conn.execute("SELECT parked_at FROM outbox WHERE event_id = %s", (event_id,)).fetchone()
                conn.commit()
                if row and row[0]:
                    return
                time.sleep(0.2)
        raise RuntimeError("the unroutable row was not parked within 120 s")

    def _quiet_phase(self) -> list[traffic.Accepted]:
        """Pipelines run one at a time while a row is parked and no other fault is injected.

        Their handoffs show whether the parked row slows anybody else down.
        """
        for url in self.urls.values():
            with psycopg.connect(scratch.dsn(url), autocommit=True) as conn:
                conn.execute(handoffs.COMMIT_CLOCK)
        quiet = traffic.Submitter(self.deployment.gateways, 1.0, f"quiet-{scratch.RUN_ID}", self.deployment.api_key)
        accepted = []
        for _ in range(self.plan.quiet_pipelines):
            accepted.append(quiet.submit())
            self._wait_terminal({accepted[-1].pipeline_id}, time.time() + self.plan.settle_s, poll_s=0.1)
        return accepted

    def _handoffs(self, pipeline_ids: set[str]) -> dict[str, latency.Summary]:
        """Commit of an outbox row -> start of the handler that takes it, for the quiet pipelines."""
        committed: dict[str, float] = {}
        received: dict[tuple[str, str], float] = {}
        written: list[tuple[str, str, str]] = []  # (producer, event id, event type) of the quiet pipelines
        for service, url in self.urls.items():
            with psycopg.connect(scratch.dsn(url)) as conn:
                for event_id, at in conn.execute("SELECT event_id, committed_at FROM bench_commit"):
                    committed[str(event_id)] = at.timestamp()
                for event_id, at in conn.execute("SELECT event_id, received_at FROM inbox"):
                    received[(service, str(event_id))] = at.timestamp()
                for event_id, event_type, pipeline_id in conn.execute(
                    "SELECT event_id, routing_key, pipeline_id FROM outbox"
                ):
                    if pipeline_id in pipeline_ids:
                        written.append((service, str(event_id), event_type))
        consumer_of = {(event_type, producer): consumer for event_type, producer, consumer in handoffs.CHAIN}
        hops: dict[str, list[float]] = {}
        for producer, event_id, event_type in written:
            consumer = consumer_of.get((event_type, producer))
            if consumer and (consumer, event_id) in received and event_id in committed:
                hops.setdefault(event_type, []).append(received[(consumer, event_id)] - committed[event_id])
        result = {event_type: latency.summary(latency.ms(values)) for event_type, values in hops.items()}
        stage_hops = [value for event_type, _, _ in handoffs.CHAIN[:3] for value in hops.get(event_type, [])]
        result["stage handoff"] = latency.summary(latency.ms(stage_hops))
        return result

    def _stopped_render(self, snapshot: checker.Snapshot, actions: list[traffic.Action]) -> list[str]:
        """What became of the render a SIGTERM interrupted: finished within the grace period, or handed back.

        Or canceled: the operator (the traffic's, at random) may cancel that very pipeline meanwhile.
        """
        pipeline_id, survivors = self.sigterm
        fault = next(f for f in self.faults if f.kind == "SIGTERM mid-render")
        job = snapshot.jobs["video"].get(pipeline_id)
        attempts = snapshot.attempts["video"].get(job["id"], []) if job else []
        stopped = [a for a in attempts if a["started_at"].timestamp() <= fault.started]
        if not stopped:
            return [f"no video attempt of {pipeline_id} was running at the SIGTERM"]
        attempt = stopped[-1]
        fault.detail = f"pipeline {pipeline_id}, attempt {attempt['number']}: " + (
            "finished within the grace period"
            if attempt["outcome"] == "succeeded"
            else f"{attempt['outcome']} ({attempt['error_code']})"
        )
        findings = [f"ffmpeg {survivors} outlived the stopped video service"] if survivors else []
        canceled = any(a.kind == "cancel" and a.pipeline_id == pipeline_id and a.answer == 202 for a in actions)
        if attempt["outcome"] == "canceled" and canceled:  # a later retry may have reopened the job since
            fault.detail += "; canceled by the operator meanwhile"
        elif attempt["outcome"] not in ("succeeded", "interrupted"):
            findings.append(f"the render stopped by SIGTERM ended {attempt['outcome']} {attempt['error_code']}")
        return findings

    def _recovery(self, snapshot: checker.Snapshot) -> None:
        """Per fault: seconds from its end until the part it hit did work again."""
        work = checker.Work.of(snapshot)
        for fault in self.faults:
            service = fault.target.rsplit("-", 1)[0] if fault.target[-1:].isdigit() else fault.target
            ended = _on_the_databases_clock(fault.ended) if fault.kind == FAILOVER else fault.ended
            if service == "relay":
                fault.recovered_s = checker.first_after(work.published, ended)
            elif service in work.handled:
                fault.recovered_s = checker.first_after(work.handled[service], ended)
            else:  # the broker, a node of it, the database server: everything
                sides = [
                    checker.first_after(work.published, ended),
                    checker.first_after(work.consumed, ended),
                ]
                fault.recovered_s = None if None in sides else max(s for s in sides if s is not None)

    def _parked_after(self, snapshot: checker.Snapshot, fault: Fault) -> str:
        """When the park of the row a relay was stopped parking began, the one that held (its transaction's start)."""
        row = next((r for r in snapshot.outbox["api"] if str(r["event_id"]) == self.frozen_refusal), None)
        if row is None or row["parked_at"] is None:
            return "; the row was never parked"
        began = row["parked_at"].timestamp() - fault.started
        return f"; the park that held began {began:.1f} s after the stop"

    def _every_submission_recorded(self, snapshot: checker.Snapshot) -> list[str]:
        """The songs the music API was asked for equal the submissions the song stage recorded before.

        The music API's own count equals the submissions the song stage recorded before sending them: none left
        unrecorded (a fence passed by), none recorded and lost.
        """
        self.provider_tasks = self.deployment.music.tasks_made
        self.recorded_submissions = sum(
            a.get("submitted_at") is not None for attempts in snapshot.attempts["song"].values() for a in attempts
        )
        if self.provider_tasks != self.recorded_submissions:
            return [
                f"the music API made {self.provider_tasks} songs, the song stage recorded"
                f" {self.recorded_submissions} submissions"
            ]
        return []

    def _frozen_sent_nothing(self, snapshot: checker.Snapshot, fault: Fault) -> list[str]:
        """The attempt a frozen replica held when it froze submitted nothing once it woke; say what became of it."""
        stage, job_id, worker, number = self.frozen_job
        attempts = {a["number"]: a for a in snapshot.attempts[stage].get(uuid.UUID(job_id), [])}
        frozen = attempts.get(number)
        if frozen is None or frozen["worker"] != worker.split("/")[0]:
            return [f"the attempt {number} of {stage} job {job_id} the frozen replica held is not on record"]
        sent = [a for a in attempts.values() if a.get("submitted_at") is not None]
        fault.detail += (
            f"; that attempt ended {frozen['outcome']} ({frozen['error_code']}),"
            f" {'with' if frozen.get('submitted_at') else 'without'} a submission; the job made"
            f" {len(sent)} submissions under {len({a['submission_key'] for a in sent})} keys"
        )
        if frozen.get("submitted_at") is not None and frozen["started_at"].timestamp() < fault.started:
            return [f"{stage} job {job_id}: the frozen replica's attempt {number} submitted its work after all"]
        return []

    def _takeovers(self, snapshot: checker.Snapshot) -> list[str]:
        """For the loss of a node: how soon work went on elsewhere, what inboxes dropped, what providers got."""
        work = checker.Work.of(snapshot)
        findings = []
        for fault in self.faults:
            if fault.kind not in (*NODE_LOSS, FAILOVER, FROZEN_IN_TRANSACTION, STANDBY_LOSS):
                continue
            since = _on_the_databases_clock(fault.ended) if fault.kind == FAILOVER else fault.started
            if fault.kind == STANDBY_LOSS:
                pass  # measured as it happened: the harness's commit
            elif fault.kind == FROZEN_IN_TRANSACTION:  # measured as it happened: until the frozen session was ended
                if stack_.service_of(fault.target) == "relay":
                    fault.detail += self._parked_after(snapshot, fault)
            elif fault.kind == "relay leader frozen":
                fault.takeover_s = checker.first_after(work.published_from["api"], since)
            elif fault.kind == "stage replica frozen":
                stage, job_id, _, number = self.frozen_job
                frozen = next(
                    (a for a in snapshot.attempts[stage].get(uuid.UUID(job_id), []) if a["number"] == number), None
                )
                if (
                    frozen is not None
                    and frozen["outcome"] == "canceled"
                    and frozen["finished_at"].timestamp() <= fault.ended
                ):
                    # The operator (the traffic's, at random) canceled it while the replica was frozen: its work
                    # ended there, and no other replica had any to take over (a retry of the operator's may reopen
                    # the job later, which is no takeover).
                    fault.takeover_s = max(0.0, frozen["finished_at"].timestamp() - since)
                    fault.detail += "; canceled by the operator meanwhile"
                else:
                    fault.takeover_s = checker.first_after(work.attempts_of(stage, job_id), since)
                findings += self._frozen_sent_nothing(snapshot, fault)
            else:  # every service consumes again, the relay publishes again
                firsts = [checker.first_after(times, since) for times in (*work.handled.values(), work.published)]
                fault.takeover_s = None if None in firsts else max(t for t in firsts if t is not None)
            window_end = fault.ended + (fault.recovered_s or 0.0) + self.plan.quiet_s
            fault.paused_s = checker.longest_pause(work.all, fault.started, window_end)
            fault.duplicates = self.counters.between(counters.DUPLICATES, fault.started, window_end)
            fault.submissions = checker.submissions(snapshot, "song", fault.started, window_end)
            bound = fault.takeover_bound_s
            if bound is not None and (fault.takeover_s is None or fault.takeover_s > bound):
                taken = "never" if fault.takeover_s is None else f"after {fault.takeover_s:.1f} s"
                findings.append(f"{fault.kind} ({fault.target}): work went on {taken}, over the {bound:g} s bound")
        return findings


def _on_the_databases_clock(moment: float) -> float:
    """A moment after the failover as the databases stamp it: the promoted primary's clock is ahead of this one's."""
    return moment + plan.STANDBY_CLOCK_AHEAD_S


def _session_state(conn: psycopg.Connection[Any], backend: int) -> str | None:
    """What a session does (its state, what it waits for, its statement's first words); None once it is gone."""
    row = conn.execute(
        "SELECT state, wait_event_type, wait_event, left(query, 60) FROM pg_stat_activity WHERE pid = %s", (backend,)
    ).fetchone()
    if row is None:
        return None
    state, kind, event, query = row
    return f"{state}{f' ({kind} {event})' if kind else ''} after `{' '.join(query.split())}`"


def _process_group(application_name: str) -> int | None:
    """The process group of the process a session's application_name (`castad:<pid>@<host>`) names; None if gone."""
    try:
        return os.getpgid(int(application_name.split(":", 1)[1].split("@", 1)[0]))
    except (ValueError, ProcessLookupError):
        return None


def run(chosen: plan.Plan, workdir: pathlib.Path, keep: bool = False) -> Result:
    """One fault run, everything it made removed afterwards (unless `keep`; its logs stay in `workdir`)."""
    cleanup = scratch.Cleanup()
    try:
        return FaultRun(chosen, workdir, cleanup, keep).run()
    finally:
        cleanup.run()


def summarize(result: Result) -> dict[str, Any]:
    """The figures the fault report gives."""
    pipelines = result.snapshot.pipelines
    outcomes: dict[str, int] = {}
    for row in pipelines.values():
        key = row["status"] if row["status"] == "SUCCEEDED" else f"{row['status']} ({row['error_code']})"
        outcomes[key] = outcomes.get(key, 0) + 1
    ended = [row for row in pipelines.values() if row["finished_at"]]
    to_terminal = [(row["finished_at"] - row["created_at"]).total_seconds() for row in ended]
    last_retry = checker.last_retries(result.snapshot)
    after_faults = [
        checker.lateness(pipeline_id, row, last_retry, result.last_fault_end)
        for pipeline_id, row in pipelines.items()
        if row["finished_at"]
    ]
    return {
        "outcomes": dict(sorted(outcomes.items())),
        "longest_to_terminal_s": max(to_terminal, default=float("nan")),
        "median_to_terminal_s": latency.percentile(to_terminal, 50),
        "p90_to_terminal_s": latency.percentile(to_terminal, 90),
        "longest_after_last_fault_s": max(after_faults, default=float("nan")),
        "attempts": {
            stage: dict(counter.most_common()) for stage, counter in checker.attempt_outcomes(result.snapshot).items()
        },
        "submissions": checker.submissions(result.snapshot, "song", result.started, result.finished),
    }


def kinds(faults: Iterable[Fault]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for fault in faults:
        counted[fault.kind] = counted.get(fault.kind, 0) + 1
    return counted
