"""After a fault run: does every service's own record show Castad kept its promise?

It reads each service's database, the artifacts on disk and the dead letters the gateway
recorded, and checks, for every pipeline the gateway accepted:
- it ended (SUCCEEDED; FAILED with a reason that is the work's, never the machinery's; or
  CANCELED by an operator or its deadline), within the stated bound after the last fault,
  and none that a client got a 202 for is missing;
- no stage took effect twice: one job, at most one succeeded attempt (its last: no provider
  was called again after a stage succeeded, retries included) and one `completed` event per
  stage, each artifact an event names on disk with its sha256 and size;
- no stage started before its predecessor's `completed` event was written, and none after
  it recorded a cancel;
- the broker routed each producer's events of a pipeline in the order they were written (as a
  queue of the harness bound to every event saw them);
- the gateway's projection agrees with what the stages recorded;
- every outbox row was published but the injected unroutable rows, each of which is parked;
- the dead letters are exactly the poison injected and a notice of each parked row, each with its reason,
  and the dead-letter queue itself was drained into the gateway's record.
Each broken rule is a finding; no finding is the promise kept.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import hashlib
import pathlib
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from castad_contracts import api, codes, events, topology
from castad_testkit import scratch
from psycopg.rows import dict_row

from castad_faults import injections

STAGES = tuple(stage.value for stage in events.STAGE_ORDER)
# Each stage's trigger, and the service whose outbox writes it: the saga's order as the contracts say it.
PREDECESSOR = {stage.value: (topology.PRODUCERS[trigger], trigger) for stage, trigger in events.TRIGGERS.items()}
TERMINAL = api.ENDED  # of a pipeline, and of a stage's job
Row = dict[str, Any]


@dataclasses.dataclass
class Snapshot:
    """What every service recorded, read after the run."""

    pipelines: dict[str, Row]
    projected: dict[tuple[str, str], Row]  # (pipeline id, stage) -> the gateway's stage row
    jobs: dict[str, dict[str, Row]]  # stage -> pipeline id -> job
    attempts: dict[str, dict[Any, list[Row]]]  # stage -> job id -> attempts by number
    outbox: dict[str, list[Row]]  # service -> rows
    inbox: dict[str, list[Row]]
    dead_letters: list[Row]  # as the gateway recorded them
    left_in_queue: list[tuple[bytes, dict[str, object]]]  # the dead-letter queue, which the gateway drains


def collect(urls: Mapping[str, str], dead_letter_queue: str, amqp_url: str) -> Snapshot:
    def rows(service: str, query: str) -> list[Row]:
        with psycopg.connect(scratch.dsn(urls[service]), row_factory=dict_row) as conn:
            return list(conn.execute(query))

    jobs = {stage: {row["pipeline_id"]: row for row in rows(stage, "SELECT * FROM jobs")} for stage in STAGES}
    attempts: dict[str, dict[Any, list[Row]]] = {}
    for stage in STAGES:
        attempts[stage] = collections.defaultdict(list)
        for row in rows(stage, "SELECT * FROM attempts ORDER BY job_id, number"):
            attempts[stage][row["job_id"]].append(row)
    return Snapshot(
        pipelines={str(row["id"]): row for row in rows("api", "SELECT * FROM pipelines")},
        projected={
            (str(row["pipeline_id"]), row["stage"]): row for row in rows("api", "SELECT * FROM pipeline_stages")
        },
        jobs=jobs,
        attempts=attempts,
        outbox={service: rows(service, "SELECT * FROM outbox ORDER BY id") for service in urls},
        inbox={service: rows(service, "SELECT * FROM inbox") for service in urls},
        dead_letters=rows("api", "SELECT * FROM dead_letters ORDER BY id"),
        left_in_queue=injections.take_dead_letters(dead_letter_queue, amqp_url),
    )


@dataclasses.dataclass(frozen=True)
class Expectations:
    accepted: frozenset[str]  # pipeline ids a client got a 202 for
    poison: tuple[injections.Poison, ...]
    unroutable_event_ids: frozenset[str]  # the rows injected to be parked (none: no row may be parked)
    last_fault_end: float  # wall clock
    settle_s: float
    artifacts_dir: pathlib.Path
    routed: tuple[str, ...] = ()  # every event id the exchange routed, in the order it routed them


def last_retries(snapshot: Snapshot) -> dict[str, float]:
    """Pipeline -> when an operator last retried it (a retry starts its run anew)."""
    return {
        row["pipeline_id"]: row["created_at"].timestamp()
        for row in snapshot.outbox["api"]
        if row["routing_key"] == "pipeline.retry_requested"
    }


def lateness(pipeline_id: str, pipeline: Row, last_retry: dict[str, float], last_fault_end: float) -> float:
    """Seconds from the end of the last fault to the pipeline's end: what the bound limits.

    Counted from the pipeline's acceptance or last retry instead when that came later.
    """
    started = max(pipeline["created_at"].timestamp(), last_retry.get(pipeline_id, 0.0))
    return float(pipeline["finished_at"].timestamp() - max(started, last_fault_end))


class Checker:
    def __init__(self, snapshot: Snapshot, expect: Expectations) -> None:
        self.s = snapshot
        self.expect = expect
        self.findings: list[str] = []
        self.completed = {
            stage: collections.Counter(
                row["pipeline_id"] for row in snapshot.outbox[stage] if row["routing_key"] == f"{stage}.completed"
            )
            for stage in STAGES
        }
        self.last_retry = last_retries(snapshot)
        self.first_event = {
            (service, row["pipeline_id"], row["routing_key"]): row
            for service, rows in snapshot.outbox.items()
            for row in reversed(rows)
        }

    def run(self) -> list[str]:
        self.none_lost()
        for pipeline_id, pipeline in self.s.pipelines.items():
            self.ended(pipeline_id, pipeline)
            self.stages_of(pipeline_id, pipeline)
        self.in_order()
        self.no_orphan_jobs()
        self.outbox_published()
        self.dead_letters()
        return self.findings

    def fail(self, text: str) -> None:
        self.findings.append(text)

    def none_lost(self) -> None:
        missing = self.expect.accepted - set(self.s.pipelines)
        if missing:
            self.fail(f"{len(missing)} accepted pipelines unknown to the gateway, e.g. {sorted(missing)[:3]}")

    def ended(self, pipeline_id: str, pipeline: Row) -> None:
        if pipeline["status"] not in TERMINAL:
            self.fail(f"{pipeline_id} never ended: {pipeline['status']} at {pipeline['current_stage']}")
            return
        if pipeline["status"] in ("FAILED", "CANCELED") and not pipeline["error_code"]:
            self.fail(f"{pipeline_id} {pipeline['status']} without a reason")
        late = lateness(pipeline_id, pipeline, self.last_retry, self.expect.last_fault_end)
        if late > self.expect.settle_s:
            self.fail(
                f"{pipeline_id} ended {late:.0f} s after the last fault (or its acceptance or last retry, if"
                f" later), over the {self.expect.settle_s:.0f} s bound"
            )

    def stages_of(self, pipeline_id: str, pipeline: Row) -> None:
        ended_early = ""  # FAILED or CANCELED: how an earlier stage ended the pipeline
        for stage in STAGES:
            job = self.s.jobs[stage].get(pipeline_id)
            if job is None:
                if pipeline["status"] == "SUCCEEDED" or not ended_early and self._triggered(stage, pipeline_id):
                    self.fail(f"{pipeline_id}: no {stage} job although its trigger was published")
                continue
            if ended_early and job["attempts"]:
                self.fail(f"{pipeline_id}: {stage} ran although an earlier stage ended {ended_early}")
            self.once(stage, pipeline_id, job)
            self.after_predecessor(stage, pipeline_id, job)
            self.projected_as_recorded(stage, pipeline_id, job)
            if job["status"] == "FAILED":
                self.failed_for_the_works_reason(stage, pipeline_id, job)
            elif job["status"] == "CANCELED":
                self.stopped_at_its_cancel(stage, pipeline_id, job)
            elif job["status"] != "SUCCEEDED" and not ended_early and pipeline["status"] in TERMINAL:
                self.fail(f"{pipeline_id}: {stage} job {job['status']} in a {pipeline['status']} pipeline")
            if job["status"] in ("FAILED", "CANCELED"):
                ended_early = ended_early or job["status"]
        if pipeline["status"] in ("FAILED", "CANCELED") and ended_early != pipeline["status"]:
            self.fail(f"{pipeline_id} {pipeline['status']} but its stages ended {ended_early or 'otherwise'}")

    def stopped_at_its_cancel(self, stage: str, pipeline_id: str, job: Row) -> None:
        """No attempt of a canceled job started after the stage recorded its cancel.

        But the one the cancel ended (outcome `canceled`): the cancel's transaction may have begun, and so dated the
        job's end, before the claim that started it committed and let it lock the job."""
        late = [
            a["number"]
            for a in self.s.attempts[stage].get(job["id"], [])
            if a["started_at"] > job["finished_at"] and a["outcome"] != "canceled"
        ]
        if late:
            self.fail(f"{pipeline_id}: {stage} attempts {late} started after its cancel")

    def _triggered(self, stage: str, pipeline_id: str) -> bool:
        service, event_type = PREDECESSOR[stage]
        return (service, pipeline_id, event_type) in self.first_event

    def once(self, stage: str, pipeline_id: str, job: Row) -> None:
        attempts = self.s.attempts[stage].get(job["id"], [])
        if [a["number"] for a in attempts] != list(range(1, job["attempts"] + 1)):
            numbers = [a["number"] for a in attempts]
            self.fail(f"{pipeline_id}: {stage} attempts numbered {numbers}, the job says {job['attempts']}")
        succeeded = [a for a in attempts if a["outcome"] == "succeeded"]
        if succeeded and succeeded[-1] is not attempts[-1]:
            self.fail(f"{pipeline_id}: {stage} ran attempt {attempts[-1]['number']} after it had succeeded")
        completed = self.completed[stage][pipeline_id]
        expected = 1 if job["status"] == "SUCCEEDED" else 0
        if len(succeeded) != expected or completed != expected:
            self.fail(
                f"{pipeline_id}: {stage} {job['status']} with {len(succeeded)} succeeded attempts"
                f" and {completed} completed events"
            )
        if job["counted_attempts"] > job["max_attempts"]:
            self.fail(f"{pipeline_id}: {stage} counted {job['counted_attempts']} attempts of {job['max_attempts']}")
        if job["status"] in TERMINAL and any(a["outcome"] == "running" for a in attempts):
            self.fail(f"{pipeline_id}: {stage} ended with an attempt still running")
        if job["status"] == "SUCCEEDED":
            self.artifact_on_disk(stage, pipeline_id, job["result"]["artifact"])

    def artifact_on_disk(self, stage: str, pipeline_id: str, artifact: Row) -> None:
        path = pathlib.Path(urllib.parse.unquote(urllib.parse.urlparse(artifact["uri"]).path))
        if not path.is_file():
            self.fail(f"{pipeline_id}: {stage} artifact missing: {path}")
            return
        content = path.read_bytes()
        if len(content) != artifact["size"] or hashlib.sha256(content).hexdigest() != artifact["sha256"]:
            self.fail(f"{pipeline_id}: {stage} artifact {path} is not what its event describes")

    def after_predecessor(self, stage: str, pipeline_id: str, job: Row) -> None:
        """No attempt started before the event that triggers the stage was written.

        (The job's row may be older: a cancel, or a retry, can create it before the trigger comes.)
        """
        service, event_type = PREDECESSOR[stage]
        trigger = self.first_event.get((service, pipeline_id, event_type))
        attempts = self.s.attempts[stage].get(job["id"], [])
        if trigger is None:
            if attempts or job["input"] is not None:
                self.fail(f"{pipeline_id}: {stage} job with input or attempts but no {event_type} event")
            return
        early = [a["number"] for a in attempts if a["started_at"] < trigger["created_at"]]
        if early:
            self.fail(
                f"{pipeline_id}: {stage} attempts {early} started before its {event_type} at {trigger['created_at']}"
            )

    def projected_as_recorded(self, stage: str, pipeline_id: str, job: Row) -> None:
        shown = self.s.projected.get((pipeline_id, stage))
        if job["status"] in TERMINAL and (shown is None or shown["status"] != job["status"]):
            self.fail(
                f"{pipeline_id}: the gateway shows {stage} {shown and shown['status']}, the stage {job['status']}"
            )

    def failed_for_the_works_reason(self, stage: str, pipeline_id: str, job: Row) -> None:
        last = self.s.attempts[stage][job["id"]][-1]
        exhausted = job["counted_attempts"] >= job["max_attempts"]
        if last["error_code"] in codes.INTERRUPTIONS or (last["outcome"] != "failed" and not exhausted):
            self.fail(f"{pipeline_id}: {stage} FAILED on {last['outcome']} {last['error_code']}, a machinery failure")
        pipeline = self.s.pipelines[pipeline_id]
        if pipeline["error_code"] != job["last_error_code"]:
            self.fail(f"{pipeline_id}: FAILED with {pipeline['error_code']}, {stage} with {job['last_error_code']}")

    def in_order(self) -> None:
        """The events of a pipeline from one producer were routed in the order they were written.

        Whatever relay published them: the first time each was routed by the broker (copies that came later are
        dropped by inboxes) never comes after a later event of the same pipeline and producer.
        """
        written = {
            str(row["event_id"]): (service, row["pipeline_id"], row["id"])
            for service, rows in self.s.outbox.items()
            for row in rows
        }
        latest: dict[tuple[str, str], int] = {}
        seen: set[str] = set()
        for event_id in self.expect.routed:
            if event_id in seen or event_id not in written:
                continue
            seen.add(event_id)
            producer, pipeline_id, position = written[event_id]
            before = latest.get((producer, pipeline_id), 0)
            if position < before:
                self.fail(f"{pipeline_id}: {producer}'s event {event_id} routed after a later one of the pipeline")
            latest[(producer, pipeline_id)] = max(before, position)

    def no_orphan_jobs(self) -> None:
        for stage in STAGES:
            orphans = set(self.s.jobs[stage]) - set(self.s.pipelines)
            if orphans:
                self.fail(f"{len(orphans)} {stage} jobs of pipelines the gateway never accepted")

    def outbox_published(self) -> None:
        for service, rows in self.s.outbox.items():
            for row in rows:
                probe = str(row["event_id"]) in self.expect.unroutable_event_ids
                if probe and (row["parked_at"] is None or "no event type" not in (row["last_error"] or "")):
                    self.fail(f"the unroutable row was not parked with its reason: {row['last_error']!r}")
                elif not probe and row["published_at"] is None:
                    self.fail(f"{service} outbox row {row['event_id']} ({row['routing_key']}) never published")

    def dead_letters(self) -> None:
        if self.s.left_in_queue:
            self.fail(
                f"{len(self.s.left_in_queue)} messages left in the dead-letter queue, not recorded by the gateway"
            )
        expected = {poison.marker: poison for poison in self.expect.poison}
        found: dict[str, Row] = {}
        parked = []
        for letter in self.s.dead_letters:
            body = bytes(letter["body"])
            if letter["kind"] == "parked":
                parked.append(letter)
                continue
            marker = next((m for m in expected if m.encode() in body), None)
            if marker is None:
                self.fail(f"an unexpected dead letter: {letter['reason']!r}: {body[:120]!r}")
            elif marker in found:
                self.fail(f"poison {marker} recorded twice")
            else:
                found[marker] = letter
        for marker, poison in expected.items():
            recorded = found.get(marker)
            if recorded is None:
                self.fail(f"{poison.kind} poison on {poison.queue} not among the dead letters")
            elif injections.EXPECTED_REASON[poison.kind] not in recorded["reason"] or recorded["queue"] != poison.queue:
                self.fail(
                    f"{poison.kind} poison on {poison.queue} recorded with {recorded['reason']!r}"
                    f" from {recorded['queue']}"
                )
        told = collections.Counter(str(letter["headers"].get("x-castad-parked-event")) for letter in parked)
        expected_told = collections.Counter(self.expect.unroutable_event_ids)
        if told != expected_told:
            self.fail(f"parked rows recorded: {dict(told)}, expected each injected one once: {sorted(expected_told)}")


def attempt_outcomes(snapshot: Snapshot) -> dict[str, collections.Counter[str]]:
    """Per stage: how many attempts ended how (`interrupted: worker_stopped`, `failed: injected_fault`, ...)."""
    result = {}
    for stage in STAGES:
        counter: collections.Counter[str] = collections.Counter()
        for attempts in snapshot.attempts[stage].values():
            for attempt in attempts:
                counter[
                    f"{attempt['outcome']}: {attempt['error_code']}" if attempt["error_code"] else attempt["outcome"]
                ] += 1
        result[stage] = counter
    return result


def first_after(times: Iterable[dt.datetime | None], moment: float) -> float | None:
    """Seconds from `moment` (wall clock) to the first of `times` after it."""
    later = [t.timestamp() - moment for t in times if t is not None and t.timestamp() >= moment]
    return min(later) if later else None


@dataclasses.dataclass(frozen=True)
class Work:
    """When each part did work, by the records of the run: what a recovery and a takeover are measured by."""

    handled: dict[str, list[dt.datetime]]  # service -> events handled, attempts started, requests accepted
    published_from: dict[str, list[dt.datetime]]  # service -> its outbox rows published
    job_attempts: dict[tuple[str, str], list[dt.datetime]]  # (stage, job id) -> its attempts' starts

    @classmethod
    def of(cls, snapshot: Snapshot) -> Work:
        handled = {service: [row["received_at"] for row in rows] for service, rows in snapshot.inbox.items()}
        handled["api"] = handled["api"] + [row["created_at"] for row in snapshot.pipelines.values()]
        job_attempts = {}
        for stage in STAGES:
            for job_id, attempts in snapshot.attempts[stage].items():
                job_attempts[(stage, str(job_id))] = [a["started_at"] for a in attempts]
                handled[stage] = handled[stage] + job_attempts[(stage, str(job_id))]
        published_from = {
            service: [row["published_at"] for row in rows if row["published_at"]]
            for service, rows in snapshot.outbox.items()
        }
        return cls(handled, published_from, job_attempts)

    @property
    def published(self) -> list[dt.datetime]:
        return [when for times in self.published_from.values() for when in times]

    @property
    def consumed(self) -> list[dt.datetime]:
        return [when for times in self.handled.values() for when in times]

    @property
    def all(self) -> list[dt.datetime]:
        return self.published + self.consumed

    def attempts_of(self, stage: str, job_id: str) -> list[dt.datetime]:
        return self.job_attempts.get((stage, job_id), [])


def longest_pause(times: Iterable[dt.datetime], start: float, end: float) -> float:
    """The longest stretch between `start` and `end` (wall clock) without any of `times`."""
    inside = sorted(t.timestamp() for t in times if start <= t.timestamp() <= end)
    edges = [start, *inside, end]
    return max(later - earlier for earlier, later in zip(edges, edges[1:], strict=False))


def submissions(snapshot: Snapshot, stage: str, start: float, end: float) -> str:
    """What a network provider got from the jobs whose attempts started between `start` and `end`.

    Submissions per job, and how many counted attempts submitted more than once under one key (a job the provider
    may do twice).
    """
    per_job: list[int] = []
    twice = 0
    for attempts in snapshot.attempts[stage].values():
        if not any(start <= a["started_at"].timestamp() <= end for a in attempts):
            continue
        sent = [a for a in attempts if a.get("submitted_at") is not None]
        per_job.append(len(sent))
        twice += sum(count > 1 for count in collections.Counter(a["submission_key"] for a in sent).values())
    if not per_job:
        return "no job"
    return (
        f"{len(per_job)} {stage} jobs: {sum(per_job) / len(per_job):.2f} submissions a job (at most {max(per_job)}),"
        f" {twice} counted attempts submitted twice under one key"
    )
