"""A fault run: the five services under steady traffic, faults injected one after another, then the checker.

Everything runs in databases, a namespace and a directory of its own (`castad_faults_<run>_*`,
`faults-<run>`, var/faults/<run>), removed at the end; traffic goes to 127.0.0.1 only. The
services reach RabbitMQ through a TCP proxy of the harness, so that the broker can be cut,
stalled or partitioned from them while it keeps running for everything else.

`python -m bench.faults [--short]` runs FULL (or SHORT) and writes FAULTS.md.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from castad_api import keys
from castad_contracts import topology
from castad_local import access
from castad_local import stack as stack_
from castad_runtime import messaging, migrations

from bench import common, latency
from bench.castad_bench import CHAIN, COMMIT_CLOCK
from bench.faults import checker, injections, outage, plan, proxy, traffic

log = logging.getLogger("bench.faults")
SERVICES = ("api", "lyric", "song", "video")
PROCESSES = ("lyric", "song", "video", "api", "relay")
QUIET_AFTER_FAULT_S = 4.0  # traffic alone between two faults
DOWN_AFTER_KILL_S = 1.0
LONG_BRIEF_S = 60  # a song this long keeps ffmpeg busy long enough to be caught mid-render
HANDOFF_P99_MS = 50.0  # the promise for pipelines no fault touches, while a row is parked


@dataclasses.dataclass
class Fault:
    kind: str
    target: str
    started: float
    ended: float = 0.0
    detail: str = ""
    recovered_s: float | None = None


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
    poison: list[injections.Poison]
    actions: list[traffic.Action]

    @property
    def last_fault_end(self) -> float:
        return max(fault.ended for fault in self.faults)


class FaultRun:
    def __init__(self, chosen: plan.Plan, workdir: pathlib.Path, cleanup: common.Cleanup, keep: bool = False) -> None:
        self.plan = chosen
        self.cleanup = cleanup
        self.keep = keep  # leave the databases, queues and files for a look afterwards
        self.workdir = workdir
        self.namespace = f"faults-{common.RUN_ID}"
        self.topology = topology.Topology(self.namespace)
        self.urls = {svc: common.database_url(f"castad_faults_{common.RUN_ID}_{svc}") for svc in SERVICES}
        self.artifacts_dir = workdir / "artifacts"
        self.port = stack_.free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.faults: list[Fault] = []
        self.proxy = proxy.TcpProxy(proxy.address_of(common.AMQP_URL))
        self.stack = stack_.Stack(self.env(proxy.through(common.AMQP_URL, self.proxy.port)), workdir / "logs")
        self.sigterm: tuple[str, list[int]] = ("", [])  # the pipeline whose render was stopped, surviving ffmpegs
        self.api_key = ""  # an admin key, made with the databases

    def env(self, amqp_url: str) -> dict[str, str]:
        return {
            **plan.service_settings(),
            "CASTAD_AMQP_URL": amqp_url,
            "CASTAD_NAMESPACE": self.namespace,
            "CASTAD_ARTIFACTS_DIR": str(self.artifacts_dir),
            "CASTAD_RELAY_SOURCES": ",".join(self.urls.values()),
            "CASTAD_API_PORT": str(self.port),
            **{f"CASTAD_{svc.upper()}_DATABASE_URL": url for svc, url in self.urls.items()},
        }

    def run(self) -> Result:
        started = time.time()
        self._setup()
        tap = injections.Tap(self.topology.exchange, keep=self.plan.duplicates)
        self.cleanup.push("close tap", tap.close)
        submitter = traffic.Submitter(
            self.base_url, self.plan.rate_per_s, f"faults-{common.RUN_ID}", self.api_key
        ).start()
        self.cleanup.push("stop traffic", submitter.stop)
        operator = traffic.Operator(self.base_url, submitter, self.plan.operator_interval_s).start()
        self.cleanup.push("stop the operator", operator.stop)
        time.sleep(2 * QUIET_AFTER_FAULT_S)

        for name in PROCESSES:
            self._kill_and_restart(name)
        self._stop_video_mid_render(submitter)
        poison = injections.poison_for(self.topology)
        injections.publish_poison(poison)
        duplicates = tap.republish()
        log.info("faults: %d poison messages and %d duplicates sent", len(poison), duplicates)
        for service in SERVICES:
            self._database_outage(service)
        self._broker("connections cut", self.proxy.cut, self.plan.broker_cut_s)
        self._broker("connections stalled", self.proxy.hold, self.plan.broker_stall_s)
        if self.plan.partition_s:
            self._broker("network partition", self.proxy.blackhole, self.plan.partition_s)
        while len(submitter.accepted) < self.plan.pipelines:
            time.sleep(1)
        operator.stop()
        submitter.stop()
        tap.close()

        accepted = list(submitter.accepted)
        self._wait_terminal({a.pipeline_id for a in accepted}, self.faults[-1].ended + self.plan.settle_s)
        probe = injections.add_unroutable_row(self.urls["api"])
        self._wait_parked(probe)
        quiet = self._quiet_phase()

        snapshot = checker.collect(self.urls, self.topology.dead_letter_queue)
        expect = checker.Expectations(
            accepted=frozenset(a.pipeline_id for a in accepted + quiet),
            poison=tuple(poison),
            unroutable_event_id=probe,
            last_fault_end=self.faults[-1].ended,
            settle_s=self.plan.settle_s,
            artifacts_dir=self.artifacts_dir,
        )
        findings = checker.Checker(snapshot, expect).run()
        findings += self._stopped_render(snapshot)
        self._recovery(snapshot)
        handoffs = self._handoffs({a.pipeline_id for a in quiet})
        if handoffs["stage handoff"]["p99"] > HANDOFF_P99_MS:
            findings.append(f"handoff p99 {handoffs['stage handoff']['p99']:.1f} ms while a row was parked")
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
            poison=poison,
            actions=list(operator.actions),
        )

    # -- set-up ---------------------------------------------------------------------------------

    def _setup(self) -> None:
        if not self.keep:
            for url in self.urls.values():
                self.cleanup.push(f"drop {url.rsplit('/', 1)[-1]}", functools.partial(migrations.drop_database, url))
            self.cleanup.push("delete topology", lambda: messaging.delete_topology(common.AMQP_URL, self.topology))
            self.cleanup.push("remove artifacts", lambda: shutil.rmtree(self.artifacts_dir, ignore_errors=True))
        for line in stack_.prepare(self.env(common.AMQP_URL)):
            log.info("faults: %s", line)
        self.api_key = access.create_key(
            "faults", frozenset(keys.Scope), "the fault harness", self.env(common.AMQP_URL)
        )
        self.proxy.start()
        self.cleanup.push("stop proxy", self.proxy.stop)
        self.cleanup.push("stop services", self.stack.stop_all)
        self.stack.start_all()
        self.stack.wait_ready(self.base_url, timeout_s=120)

    # -- faults ---------------------------------------------------------------------------------

    def _record(
        self, kind: str, target: str, inject: Callable[[], None], last_s: float, heal: Callable[[], None]
    ) -> Fault:
        fault = Fault(kind, target, time.time())
        log.info("faults: %s of %s", kind, target)
        inject()
        time.sleep(last_s)
        heal()
        fault.ended = time.time()
        self.faults.append(fault)
        time.sleep(QUIET_AFTER_FAULT_S)
        return fault

    def _kill_and_restart(self, name: str) -> None:
        def restart() -> None:
            self.stack.start(name)
            if name == "api":
                self.stack.wait_ready(self.base_url, timeout_s=60)

        self._record("kill -9", name, lambda: self.stack.kill(name), DOWN_AFTER_KILL_S, restart)

    def _stop_video_mid_render(self, submitter: traffic.Submitter) -> None:
        """SIGTERM to the video service's process group while its ffmpeg renders a long song."""
        long_ones = {submitter.submit(duration_s=LONG_BRIEF_S).pipeline_id for _ in range(3)}
        video = self.stack.processes["video"]
        deadline = time.monotonic() + 300
        while True:
            rendering = [
                pid for pid in injections.ffmpeg_children(video.pid) if injections.pipeline_of(pid) in long_ones
            ]
            if rendering:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("no long render seen within 300 s")
            time.sleep(0.02)
        pipeline_id = injections.pipeline_of(rendering[0]) or ""
        fault = Fault("SIGTERM mid-render", "video", time.time())
        self.stack.signal("video", signal.SIGTERM)
        video.wait(60)
        self.stack.processes.pop("video")
        self.sigterm = (pipeline_id, [pid for pid in rendering if _alive(pid)])
        self.stack.start("video")
        fault.ended = time.time()
        self.faults.append(fault)
        time.sleep(QUIET_AFTER_FAULT_S)

    def _database_outage(self, service: str) -> None:
        url = self.urls[service]
        self._record(
            "database outage",
            service,
            lambda: outage.block(url),
            self.plan.outage_s,
            lambda: outage.unblock(url),
        )

    def _broker(self, kind: str, inject: Callable[[], None], last_s: float) -> None:
        self._record(kind, "broker", inject, last_s, self.proxy.restore)

    # -- waiting and measuring ------------------------------------------------------------------

    def _wait_terminal(self, pipeline_ids: set[str], deadline: float, poll_s: float = 1.0) -> None:
        while True:
            with psycopg.connect(common.dsn(self.urls["api"])) as conn:
                ended = conn.execute("SELECT id FROM pipelines WHERE status = ANY(%s)", (list(checker.TERMINAL),))
                done = {str(row[0]) for row in ended}
            left = pipeline_ids - done
            if not left or time.time() > deadline:
                log.debug("faults: %d of %d pipelines ended", len(pipeline_ids) - len(left), len(pipeline_ids))
                return
            time.sleep(poll_s)

    def _wait_parked(self, event_id: str) -> None:
        deadline = time.time() + 120
        with psycopg.connect(common.dsn(self.urls["api"])) as conn:
            while time.time() < deadline:
                row = conn.execute("SELECT parked_at FROM outbox WHERE event_id = %s", (event_id,)).fetchone()
                conn.commit()
                if row and row[0]:
                    return
                time.sleep(0.2)
        raise RuntimeError("the unroutable row was not parked within 120 s")

    def _quiet_phase(self) -> list[traffic.Accepted]:
        """Pipelines run one at a time while a row is parked and no other fault is injected: their handoffs
        show whether the parked row slows anybody else down."""
        for url in self.urls.values():
            with psycopg.connect(common.dsn(url), autocommit=True) as conn:
                conn.execute(COMMIT_CLOCK)
        quiet = traffic.Submitter(self.base_url, 1.0, f"quiet-{common.RUN_ID}", self.api_key)
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
            with psycopg.connect(common.dsn(url)) as conn:
                for event_id, at in conn.execute("SELECT event_id, committed_at FROM bench_commit"):
                    committed[str(event_id)] = at.timestamp()
                for event_id, at in conn.execute("SELECT event_id, received_at FROM inbox"):
                    received[(service, str(event_id))] = at.timestamp()
                for event_id, event_type, pipeline_id in conn.execute(
                    "SELECT event_id, routing_key, pipeline_id FROM outbox"
                ):
                    if pipeline_id in pipeline_ids:
                        written.append((service, str(event_id), event_type))
        consumer_of = {(event_type, producer): consumer for event_type, producer, consumer in CHAIN}
        hops: dict[str, list[float]] = {}
        for producer, event_id, event_type in written:
            consumer = consumer_of.get((event_type, producer))
            if consumer and (consumer, event_id) in received and event_id in committed:
                hops.setdefault(event_type, []).append(received[(consumer, event_id)] - committed[event_id])
        result = {event_type: latency.summary(latency.ms(values)) for event_type, values in hops.items()}
        stage_hops = [value for event_type, _, _ in CHAIN[:3] for value in hops.get(event_type, [])]
        result["stage handoff"] = latency.summary(latency.ms(stage_hops))
        return result

    def _stopped_render(self, snapshot: checker.Snapshot) -> list[str]:
        """What became of the render a SIGTERM interrupted: finished within the grace period, or handed back."""
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
        if attempt["outcome"] not in ("succeeded", "interrupted"):
            findings.append(f"the render stopped by SIGTERM ended {attempt['outcome']} {attempt['error_code']}")
        return findings

    def _recovery(self, snapshot: checker.Snapshot) -> None:
        """Per fault: seconds from its end until the part it hit did work again."""
        handled = {service: [row["received_at"] for row in rows] for service, rows in snapshot.inbox.items()}
        handled["api"] = handled["api"] + [row["created_at"] for row in snapshot.pipelines.values()]
        for stage in checker.STAGES:
            handled[stage] = handled[stage] + [
                a["started_at"] for rows in snapshot.attempts[stage].values() for a in rows
            ]
        published = [row["published_at"] for rows in snapshot.outbox.values() for row in rows]
        consumed = [when for times in handled.values() for when in times]
        for fault in self.faults:
            if fault.target == "relay":
                fault.recovered_s = checker.first_after(published, fault.ended)
            elif fault.target == "broker":
                sides = [checker.first_after(published, fault.ended), checker.first_after(consumed, fault.ended)]
                fault.recovered_s = None if None in sides else max(s for s in sides if s is not None)
            else:
                fault.recovered_s = checker.first_after(handled[fault.target], fault.ended)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = pathlib.Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def run(chosen: plan.Plan, workdir: pathlib.Path, keep: bool = False) -> Result:
    """One fault run, everything it made removed afterwards (unless `keep`; its logs stay in `workdir`)."""
    cleanup = common.Cleanup()
    try:
        return FaultRun(chosen, workdir, cleanup, keep).run()
    finally:
        cleanup.run()


def summarize(result: Result) -> dict[str, Any]:
    """The figures FAULTS.md reports."""
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
    }


def kinds(faults: Iterable[Fault]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for fault in faults:
        counted[fault.kind] = counted.get(fault.kind, 0) + 1
    return counted
