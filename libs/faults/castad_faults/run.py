"""A fault run: the services under steady traffic, faults injected one after another, then the checker.

(The short plan kills a replica of every service at once, and takes every service's database out at once.)

The services run in replicas on clustered engines.

What runs where: `deployment.Deployment`; what injects the faults: `injector` and `freezes`; what they did:
`measures`; what the run found: `outcome`. Faults, in order: kill -9 of a replica of each service,
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

import logging
import pathlib
import time

import psycopg
from castad_testkit import handoffs, scratch

from castad_faults import checker, counters, deployment, freezes, injections, injector, measures, outcome, plan, traffic

log = logging.getLogger("castad_faults")
SERVICES = deployment.SERVICES
PROCESSES = deployment.PROCESSES


class FaultRun:
    def __init__(self, chosen: plan.Plan, workdir: pathlib.Path, cleanup: scratch.Cleanup, keep: bool = False) -> None:
        self.plan = chosen
        self.cleanup = cleanup
        self.deployment = deployment.Deployment(workdir, cleanup, keep)
        self.topology = self.deployment.topology
        self.urls = self.deployment.urls
        self.counters = counters.Counters(self.deployment.metrics_endpoints)
        self.injector = injector.Injector(chosen, self.deployment, self.counters)

    def run(self) -> outcome.Result:
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

        self.injector.kill_and_restart([deployment.Deployment.names(service)[0] for service in PROCESSES])
        self.injector.stop_video_mid_render()
        poison = injections.poison_for(self.topology)
        injections.publish_poison(poison, self.deployment.amqp_url)
        duplicates = tap.republish()
        log.info("faults: %d poison messages and %d duplicates sent", len(poison), duplicates)
        self.injector.database_outages(list(SERVICES))
        self.injector.broker("connections cut", "cut", self.plan.broker_cut_s)
        self.injector.broker("connections stalled", "hold", self.plan.broker_stall_s)
        if self.plan.partition_s:
            self.injector.broker("network partition", "blackhole", self.plan.partition_s)
        leader = self.injector.lose_the_queues_leader()
        self.injector.stop_a_node(other_than=leader)
        self.injector.cut_off_a_node()
        self.injector.freeze_the_relay_leader()
        freezes.freeze_a_stage_replica_mid_attempt(self.injector)
        freezes.freeze_inside_transactions(self.injector)
        self.injector.lose_a_postgresql_standby()
        self.injector.fail_over_postgresql()
        while len(submitter.accepted) < self.plan.pipelines:
            time.sleep(1)
        operator.stop()
        submitter.stop()

        accepted = list(submitter.accepted)
        self._wait_terminal({a.pipeline_id for a in accepted}, self.injector.faults[-1].ended + self.plan.settle_s)
        self.injector.probes.append(injections.add_unroutable_row(self.urls["api"]))
        for probe in self.injector.probes:
            self._wait_parked(probe)
        quiet = self._quiet_phase() if self.plan.quiet_pipelines else []
        tap.close()

        snapshot = checker.collect(self.urls, self.topology.dead_letter_queue, self.deployment.amqp_url)
        expect = checker.Expectations(
            accepted=frozenset(a.pipeline_id for a in accepted + quiet),
            poison=tuple(poison),
            unroutable_event_ids=frozenset(self.injector.probes),
            # The last fault is the failover: the pipelines' ends after it are stamped by the promoted primary.
            last_fault_end=outcome.on_the_databases_clock(self.injector.faults[-1].ended),
            settle_s=self.plan.settle_s,
            artifacts_dir=self.deployment.artifacts_dir,
            routed=tuple(tap.routed),
        )
        findings = checker.Checker(snapshot, expect).run()
        findings += measures.stopped_render(self.injector, snapshot, operator.actions)
        measures.recovery(self.injector.faults, snapshot)
        findings += measures.takeovers(self.injector, snapshot)
        provider_tasks = self.deployment.music.tasks_made
        recorded_submissions = measures.recorded_submissions(snapshot)
        findings += measures.every_submission_recorded(provider_tasks, recorded_submissions)
        handoffs_ms = measures.handoffs(self.urls, {a.pipeline_id for a in quiet}) if quiet else {}
        return outcome.Result(
            plan=self.plan,
            started=started,
            finished=time.time(),
            accepted=accepted,
            quiet=quiet,
            refusals=dict(submitter.refusals),
            faults=self.injector.faults,
            findings=findings,
            snapshot=snapshot,
            handoffs_ms=handoffs_ms,
            duplicates=duplicates,
            dropped=self.counters.total(counters.DUPLICATES, time.time()),
            provider_tasks=provider_tasks,
            recorded_submissions=recorded_submissions,
            poison=poison,
            probes=list(self.injector.probes),
            actions=list(operator.actions),
        )

    def _until_a_pipeline_succeeded(self) -> None:
        """Before the first fault: the deployment did a whole pipeline (every part works)."""
        deadline = time.monotonic() + 120
        with psycopg.connect(scratch.dsn(self.urls["api"]), autocommit=True) as conn:
            while not conn.execute("SELECT 1 FROM pipelines WHERE status = 'SUCCEEDED' LIMIT 1").fetchone():
                if time.monotonic() > deadline:
                    raise RuntimeError("no pipeline succeeded within 120 s of the start")
                time.sleep(0.2)

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


def run(chosen: plan.Plan, workdir: pathlib.Path, keep: bool = False) -> outcome.Result:
    """One fault run, everything it made removed afterwards (unless `keep`; its logs stay in `workdir`)."""
    cleanup = scratch.Cleanup()
    try:
        return FaultRun(chosen, workdir, cleanup, keep).run()
    finally:
        cleanup.run()
