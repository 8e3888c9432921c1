"""What the faults did, measured once the run is over from what every service recorded (a checker's snapshot).

Per fault: how soon the part it hit worked again, and for the loss of a node how soon work went on elsewhere; what
became of the render a SIGTERM stopped and of the attempt a frozen replica held; whether the music API made exactly
the songs the song stage recorded; and the quiet pipelines' handoffs.
"""

from __future__ import annotations

import uuid

import psycopg
from castad_local import stack as stack_
from castad_testkit import handoffs as handoffs_
from castad_testkit import latency, scratch

from castad_faults import checker, counters, outcome, traffic
from castad_faults.injector import Injector


def handoffs(urls: dict[str, str], pipeline_ids: set[str]) -> dict[str, latency.Summary]:
    """Commit of an outbox row -> start of the handler that takes it, for the quiet pipelines."""
    committed: dict[str, float] = {}
    received: dict[tuple[str, str], float] = {}
    written: list[tuple[str, str, str]] = []  # (producer, event id, event type) of the quiet pipelines
    for service, url in urls.items():
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
    consumer_of = {(event_type, producer): consumer for event_type, producer, consumer in handoffs_.CHAIN}
    hops: dict[str, list[float]] = {}
    for producer, event_id, event_type in written:
        consumer = consumer_of.get((event_type, producer))
        if consumer and (consumer, event_id) in received and event_id in committed:
            hops.setdefault(event_type, []).append(received[(consumer, event_id)] - committed[event_id])
    result = {event_type: latency.summary(latency.ms(values)) for event_type, values in hops.items()}
    stage_hops = [value for event_type, _, _ in handoffs_.CHAIN[:3] for value in hops.get(event_type, [])]
    result["stage handoff"] = latency.summary(latency.ms(stage_hops))
    return result


def stopped_render(injector: Injector, snapshot: checker.Snapshot, actions: list[traffic.Action]) -> list[str]:
    """What became of the render a SIGTERM interrupted: finished within the grace period, or handed back.

    Or canceled: the operator (the traffic's, at random) may cancel that very pipeline meanwhile.
    """
    pipeline_id, survivors = injector.sigterm
    fault = next(f for f in injector.faults if f.kind == "SIGTERM mid-render")
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


def recovery(faults: list[outcome.Fault], snapshot: checker.Snapshot) -> None:
    """Per fault: seconds from its end until the part it hit did work again."""
    work = checker.Work.of(snapshot)
    for fault in faults:
        service = fault.target.rsplit("-", 1)[0] if fault.target[-1:].isdigit() else fault.target
        ended = outcome.on_the_databases_clock(fault.ended) if fault.kind == outcome.FAILOVER else fault.ended
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


def _parked_after(snapshot: checker.Snapshot, fault: outcome.Fault, frozen_refusal: str) -> str:
    """When the park of the row a relay was stopped parking began, the one that held (its transaction's start)."""
    row = next((r for r in snapshot.outbox["api"] if str(r["event_id"]) == frozen_refusal), None)
    if row is None or row["parked_at"] is None:
        return "; the row was never parked"
    began = row["parked_at"].timestamp() - fault.started
    return f"; the park that held began {began:.1f} s after the stop"


def recorded_submissions(snapshot: checker.Snapshot) -> int:
    """The submissions the song stage recorded before they left."""
    return sum(a.get("submitted_at") is not None for attempts in snapshot.attempts["song"].values() for a in attempts)


def every_submission_recorded(provider_tasks: int, recorded: int) -> list[str]:
    """The songs the music API was asked for equal the submissions the song stage recorded before.

    The music API's own count equals the submissions the song stage recorded before sending them: none left
    unrecorded (a fence passed by), none recorded and lost.
    """
    if provider_tasks != recorded:
        return [f"the music API made {provider_tasks} songs, the song stage recorded {recorded} submissions"]
    return []


def _frozen_sent_nothing(
    snapshot: checker.Snapshot, fault: outcome.Fault, frozen_job: tuple[str, str, str, int]
) -> list[str]:
    """The attempt a frozen replica held when it froze submitted nothing once it woke; say what became of it."""
    stage, job_id, worker, number = frozen_job
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


def takeovers(injector: Injector, snapshot: checker.Snapshot) -> list[str]:
    """For the loss of a node: how soon work went on elsewhere, what inboxes dropped, what providers got."""
    work = checker.Work.of(snapshot)
    findings = []
    for fault in injector.faults:
        if fault.kind not in (
            *outcome.NODE_LOSS,
            outcome.FAILOVER,
            outcome.FROZEN_IN_TRANSACTION,
            outcome.STANDBY_LOSS,
        ):
            continue
        since = outcome.on_the_databases_clock(fault.ended) if fault.kind == outcome.FAILOVER else fault.started
        if fault.kind == outcome.STANDBY_LOSS:
            pass  # measured as it happened: the harness's commit
        elif fault.kind == outcome.FROZEN_IN_TRANSACTION:  # measured as it happened: until the frozen session was ended
            if stack_.service_of(fault.target) == "relay":
                fault.detail += _parked_after(snapshot, fault, injector.frozen_refusal)
        elif fault.kind == "relay leader frozen":
            fault.takeover_s = checker.first_after(work.published_from["api"], since)
        elif fault.kind == "stage replica frozen":
            stage, job_id, _, number = injector.frozen_job
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
            findings += _frozen_sent_nothing(snapshot, fault, injector.frozen_job)
        else:  # every service consumes again, the relay publishes again
            firsts = [checker.first_after(times, since) for times in (*work.handled.values(), work.published)]
            fault.takeover_s = None if None in firsts else max(t for t in firsts if t is not None)
        window_end = fault.ended + (fault.recovered_s or 0.0) + injector.plan.quiet_s
        fault.paused_s = checker.longest_pause(work.all, fault.started, window_end)
        fault.duplicates = injector.counters.between(counters.DUPLICATES, fault.started, window_end)
        fault.submissions = checker.submissions(snapshot, "song", fault.started, window_end)
        bound = fault.takeover_bound_s
        if bound is not None and (fault.takeover_s is None or fault.takeover_s > bound):
            taken = "never" if fault.takeover_s is None else f"after {fault.takeover_s:.1f} s"
            findings.append(f"{fault.kind} ({fault.target}): work went on {taken}, over the {bound:g} s bound")
    return findings
