"""`make bench-replicas`: two replicas of every stage and of the relay beside one of each, in one run.

One installation (bench.castad_bench: its own databases, namespace and processes, instant providers) with one
gateway, which the client talks to, and every worker a replica of its service (`lyric-1`, `relay-1`, ...). Rounds
of `--pipelines` pipelines at `--concurrency` requests in flight alternate between two replicas of lyric, song,
video and the relay (`lyric-2`, ... started beside the first) and one of each (the second ones stopped), in the
order two, one, one, two, ... so that only every other round starts or stops a process. After a switch, the
stages' queues are waited on until their consumers doubled or halved, and a few pipelines run one at a time
before the round is timed.

Each round: pipelines a second, CPU per pipeline of each service's processes (summed over its replicas), and how
the work was spread: attempts per replica (`attempts.worker`) and which relay led each outbox at the round's end
(`outbox_leader`, with the takeovers during the round). After the last round, every pipeline of the run is
checked (castad_faults.checker's rules, without faults): each SUCCEEDED with exactly one job, one succeeded
attempt and one `completed` event per stage, no dead letter, no parked or unpublished outbox row, each producer's
events of a pipeline routed by the broker in the order written (a queue of the harness bound to every event saw
them) and published in that order (`outbox.published_at`), and each pipeline's gateway timeline in stage order. A
finding fails the run.

Two replicas on a two-core machine share the same cores as one: this shows nothing lost or reordered with
replicas competing, not what replicas add on more cores.
"""

from __future__ import annotations

import collections
import logging
import os
import pathlib
import sys
import time
from collections.abc import Iterable
from typing import Any

import pika
import psycopg
from castad_contracts import topology
from castad_faults import checker
from castad_local import stack as stack_
from castad_testkit import machine, scratch

from bench import castad_bench, handoff_parts, pages, report

REPLICATED = topology.WORKERS  # the gateway stays one process: the client talks to it alone
REPLICAS = 2
STAGES = castad_bench.STAGES
ONE, TWO = "one of each", "two of each"


def processes(replicas: int) -> list[str]:
    """The process names of the installation with `replicas` of every worker: `api`, `relay-1`, `relay-2`, ..."""
    return ["api", *(stack_.replica(service, n) for service in REPLICATED for n in range(1, replicas + 1))]


def order(rounds: int) -> list[str]:
    """Each round's installation, pairs alternating so that every other round switches: two, one, one, two, ..."""
    return [config for pair in range(rounds) for config in ((TWO, ONE) if pair % 2 == 0 else (ONE, TWO))]


class Installation:
    """The one installation of the run, switched between one and two replicas of every worker."""

    def __init__(self, cleanup: scratch.Cleanup, workdir: pathlib.Path) -> None:
        self.bench = castad_bench.CastadBench(cleanup, workdir)
        self.replicas = 1
        self.per_replica: dict[str, int] = {}  # stage -> consumers of its queue in one process

    @property
    def stack(self) -> stack_.Stack:
        assert self.bench.stack is not None
        return self.bench.stack

    def start(self) -> None:
        """Set the installation up with one process of each service, and learn a stage process's consumers."""
        self.bench.setup()
        self.bench.start(processes(1))
        deadline = time.monotonic() + 120
        seen = self._consumers()
        while not all(seen.values()) or self._consumers() != seen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the stages' queues have consumers {seen} after 120 s")
            self.stack.check_alive()
            time.sleep(1)
            seen = self._consumers()
        self.per_replica = seen

    def switch(self, replicas: int) -> None:
        """Start or stop the workers' second replicas, then wait until the stages' queues have their consumers."""
        if replicas == self.replicas:
            return
        for name in processes(REPLICAS):
            if name not in processes(1):
                if replicas > self.replicas:
                    self.stack.start(name)
                else:
                    self.stack.stop(name)
        self.replicas = replicas
        deadline = time.monotonic() + 120
        expected = {stage: count * replicas for stage, count in self.per_replica.items()}
        while (seen := self._consumers()) != expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the stages' queues have consumers {seen}, not {expected}, after 120 s")
            self.stack.check_alive()
            time.sleep(0.2)

    def _consumers(self) -> dict[str, int]:
        """Stage -> consumers of its queue now."""
        connection = pika.BlockingConnection(pika.URLParameters(scratch.AMQP_URL))
        try:
            channel = connection.channel()
            return {
                stage: channel.queue_declare(self.bench.topology.queue(stage), passive=True).method.consumer_count
                for stage in STAGES
            }
        finally:
            connection.close()

    # -- what each round measures

    def leaders(self) -> dict[str, tuple[str, int]]:
        """Database -> (the process leading its outbox, its lease's term)."""
        result = {}
        for service, url in self.bench.urls.items():
            with psycopg.connect(scratch.dsn(url), autocommit=True) as conn:
                row = conn.execute("SELECT holder, term FROM outbox_leader").fetchone()
            result[service] = ("none", 0) if row is None else (self._name(row[0]), int(row[1]))
        return result

    def attempts(self, ids: list[str]) -> dict[str, dict[str, int]]:
        """Stage -> process -> attempts it ran of these pipelines."""
        spread: dict[str, dict[str, int]] = {}
        for stage in STAGES:
            with psycopg.connect(scratch.dsn(self.bench.urls[stage]), autocommit=True) as conn:
                rows = conn.execute(
                    "SELECT a.worker, count(*) FROM attempts a JOIN jobs j ON j.id = a.job_id"
                    " WHERE j.pipeline_id = ANY(%s) GROUP BY a.worker",
                    (ids,),
                ).fetchall()
            spread[stage] = dict(sorted((self._name(worker), int(count)) for worker, count in rows))
        return spread

    def _name(self, worker: str) -> str:
        try:
            return self.stack.process_of(worker)
        except LookupError:
            return "a stopped process"

    def round(self, pipelines: int, concurrency: int, first: int, warmup: int) -> dict[str, Any]:
        self.bench.sequential(warmup, first)
        first += warmup
        before = self.leaders()
        measured = self.bench.throughput(pipelines, concurrency, first, count_commits=False)
        after = self.leaders()
        ids = self._ids(first, pipelines)
        by_service: dict[str, float] = collections.defaultdict(float)
        for name, ms in measured["cpu_ms_per_pipeline"].items():
            by_service[stack_.service_of(name)] += ms
        return {
            "config": TWO if self.replicas == REPLICAS else ONE,
            "processes": sorted(self.stack.processes),
            "rate": measured["rate"],
            "seconds": measured["seconds"],
            "latency_ms": measured["latency_ms"],
            "cpu_ms_per_pipeline": dict(by_service),
            "attempts": self.attempts(ids),
            "leaders": {
                service: {"holder": after[service][0], "takeovers": after[service][1] - before[service][1]}
                for service in after
            },
        }

    def _ids(self, first: int, count: int) -> list[str]:
        """The ids of the pipelines whose briefs were numbered first .. first + count - 1."""
        names = [self.bench.brief_of(number).customer_name for number in range(first, first + count)]
        with psycopg.connect(scratch.dsn(self.bench.urls["api"]), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT id::text FROM pipelines WHERE brief->>'customer_name' = ANY(%s)", (names,)
            ).fetchall()
        return [row[0] for row in rows]


def run(
    cleanup: scratch.Cleanup, workdir: pathlib.Path, pipelines: int, concurrency: int, rounds: int, warmup: int
) -> dict[str, Any]:
    """`rounds` pairs of rounds, two replicas of every worker against one, then every pipeline checked."""
    with cleanup.scope():
        installation = Installation(cleanup, workdir)
        installation.start()
        tap = handoff_parts.Tap(installation.bench.topology.exchange)
        tap.start()
        cleanup.push("stop the tap", tap.stop)
        started = time.time()
        done, first = [], 0
        for config in order(rounds):
            installation.switch(REPLICAS if config == TWO else 1)
            measured = installation.round(pipelines, concurrency, first, warmup)
            first += warmup + pipelines
            done.append(measured)
            scratch.log.info(
                "replicas: %s: %.1f pipelines/s, %.1f ms CPU a pipeline",
                config,
                measured["rate"],
                sum(measured["cpu_ms_per_pipeline"].values()),
            )
        time.sleep(1)  # the tap's last deliveries
        tap.stop()
        # The services stopped first: what they recorded is final, and their connections are free for the check's.
        installation.stack.stop_all()
        checked, findings = check(installation.bench, tuple(tap.seen), started)
    return {
        "cores": os.cpu_count(),
        "gateways": 1,
        "replicas": REPLICAS,
        "replicated": list(REPLICATED),
        "pipelines": pipelines,
        "concurrency": concurrency,
        "rounds": done,
        "checked": checked,
        "findings": findings,
    }


def check(bench: castad_bench.CastadBench, routed: tuple[str, ...], started: float) -> tuple[dict[str, Any], list[str]]:
    """Check every pipeline of the run: what was checked, and the findings (none: nothing lost or reordered)."""
    snapshot = checker.collect(bench.urls, bench.topology.dead_letter_queue, scratch.AMQP_URL)
    expect = checker.Expectations(
        accepted=frozenset(snapshot.pipelines),
        poison=(),
        unroutable_event_ids=frozenset(),
        last_fault_end=started,
        settle_s=float("inf"),
        artifacts_dir=bench.artifacts_dir,
        routed=routed,
    )
    rules = checker.Checker(snapshot, expect)
    for pipeline_id, pipeline in snapshot.pipelines.items():
        rules.ended(pipeline_id, pipeline)
        rules.stages_of(pipeline_id, pipeline)
        if pipeline["status"] != "SUCCEEDED":
            rules.fail(f"{pipeline_id} ended {pipeline['status']}")
    rules.in_order()
    rules.no_orphan_jobs()
    findings = rules.findings
    findings += published_in_order(snapshot.outbox)
    findings += [f"{len(snapshot.dead_letters)} dead letters recorded"] if snapshot.dead_letters else []
    findings += [f"{len(snapshot.left_in_queue)} messages in the dead-letter queue"] if snapshot.left_in_queue else []
    held = [row for rows in snapshot.outbox.values() for row in rows if row["published_at"] is None]
    if held:
        parked = sum(row["parked_at"] is not None for row in held)
        findings.append(f"{len(held)} outbox rows not published, {parked} of them parked")
    with psycopg.connect(scratch.dsn(bench.urls["api"]), autocommit=True) as conn:
        timeline = conn.execute("SELECT pipeline_id::text, event_type FROM pipeline_events ORDER BY seq").fetchall()
    findings += timelines_in_order(timeline)
    routed_once = set(routed)
    checked = {
        "pipelines": len(snapshot.pipelines),
        "succeeded": sum(p["status"] == "SUCCEEDED" for p in snapshot.pipelines.values()),
        "completed_events": {stage: sum(rules.completed[stage].values()) for stage in STAGES},
        "outbox_rows": sum(len(rows) for rows in snapshot.outbox.values()),
        "routed": len(routed_once),
        "timeline_entries": len(timeline),
        "dead_letters": len(snapshot.dead_letters) + len(snapshot.left_in_queue),
        "parked": sum(row["parked_at"] is not None for rows in snapshot.outbox.values() for row in rows),
    }
    return checked, findings


def published_in_order(outboxes: dict[str, list[checker.Row]]) -> list[str]:
    """Findings: a row published before an earlier-written row of the same pipeline in the same outbox."""
    findings = []
    for service, rows in outboxes.items():
        latest: dict[str, Any] = {}
        for row in sorted(rows, key=lambda row: row["id"]):
            published, pipeline_id = row["published_at"], row["pipeline_id"]
            if published is None:
                continue
            if pipeline_id in latest and published < latest[pipeline_id]:
                findings.append(f"{pipeline_id}: {service}'s {row['routing_key']} published before an earlier row")
            latest[pipeline_id] = max(published, latest.get(pipeline_id, published))
    return findings


def timelines_in_order(entries: Iterable[tuple[str, str]]) -> list[str]:
    """Findings: a pipeline's gateway timeline (entries in the order written) going back in the saga.

    A stage's entries come after the previous stage's, and its `completed` is its last.
    """
    rank = {stage: number for number, stage in enumerate(STAGES)}
    last: dict[str, tuple[int, int]] = {}
    findings = []
    for pipeline_id, event_type in entries:
        stage, _, fact = event_type.partition(".")
        if stage not in rank:
            continue
        position = (rank[stage], 1 if fact == "completed" else 0)
        if position < last.get(pipeline_id, (-1, 0)):
            findings.append(f"{pipeline_id}: timeline entry {event_type} after a later stage's")
        last[pipeline_id] = max(position, last.get(pipeline_id, position))
    return findings


def render(measured: dict[str, Any]) -> str:
    """Return the page: where it comes from, the machine, then the section `make bench` shows too."""
    return pages.render("replicas.md.j2", replicas=report.replicas(measured))


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("replicas", __doc__)
    parser.add_argument("--pipelines", type=int, default=150, help="pipelines of each round")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight while submitting")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of rounds, two replicas and one")
    parser.add_argument("--warmup", type=int, default=5, help="pipelines run one at a time before each round")
    args = parser.parse_args(argv)
    if args.pipelines < 1 or args.rounds < 1 or args.concurrency < 1:
        parser.error("--pipelines, --rounds and --concurrency must be at least 1")
    measured: dict[str, Any] | None = None
    if not args.render:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
        scratch.log.setLevel(logging.INFO)
        workdir = (scratch.REPO_ROOT / "var" / "bench" / scratch.RUN_ID).resolve()
        cleanup = scratch.Cleanup()
        started = time.monotonic()
        try:
            with scratch.interrupt_on_sigterm():
                facts = {**machine.facts(), "load": list(machine.load())}
                result = run(cleanup, workdir, args.pipelines, args.concurrency, args.rounds, args.warmup)
        finally:
            cleanup.run()
        options = argv if argv is not None else sys.argv[1:]
        measured = {"facts": facts, "options": options, **result, "seconds": time.monotonic() - started}
    kept = pages.write(args.output, render, measured)
    for finding in kept["findings"]:
        scratch.log.error("finding: %s", finding)
    return 1 if kept["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
