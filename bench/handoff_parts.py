"""The parts of a handoff, timed: the harness's observers of the idle run, and what the timestamps say.

Timestamps all come from one host clock: PostgreSQL's (now(), clock_timestamp()) and
Python's time.time() are both CLOCK_REALTIME of this machine.

- commit: during the idle run only, a deferred constraint trigger on each outbox, added
  by the harness to its own databases, records clock_timestamp() per row when the
  writing transaction COMMITs (deferred triggers fire at COMMIT, before the commit's WAL
  flush). outbox.created_at is now() = the start of the writing transaction, earlier.
- notify seen: a LISTEN connection of the harness on each database, next to the relay's.
- broker routed: arrival on a tap queue of the harness bound to the exchange with `#`.
- published: outbox.published_at, set by the relay once RabbitMQ confirmed the row's batch.
- handler start: inbox.received_at in the consuming service = now() of the handler's
  transaction, whose first statement is the inbox insert.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterable
from typing import Any

import pika
import psycopg
from castad_contracts import topology
from castad_runtime import db
from castad_testkit import handoffs, latency, scratch


def epoch(value: dt.datetime | None) -> float | None:
    """A database's timestamp in seconds since the epoch (None stays None)."""
    return None if value is None else value.timestamp()


class Tap(threading.Thread):
    """Records when each event reaches a queue of ours bound to the exchange (`#`)."""

    def __init__(self, exchange: str) -> None:
        super().__init__(name="tap", daemon=True)
        self.connection = pika.BlockingConnection(pika.URLParameters(scratch.AMQP_URL))
        self.channel = self.connection.channel()
        declared = self.channel.queue_declare("", exclusive=True, auto_delete=True)
        self.queue = declared.method.queue
        self.channel.queue_bind(self.queue, exchange, routing_key="#")
        self.seen: dict[str, float] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        for method, properties, _ in self.channel.consume(self.queue, auto_ack=True, inactivity_timeout=0.1):
            if method is not None and properties.message_id:
                self.seen[properties.message_id] = time.time()
            if self.stopping.is_set():
                break

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        try:
            self.channel.cancel()
            self.connection.close()
        except Exception:
            pass


class NotifyClock(threading.Thread):
    """Records when outbox notifications of one database arrive (a LISTEN like the relay's)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="notify-clock", daemon=True)
        self.conn = psycopg.connect(scratch.dsn(url), autocommit=True)
        self.conn.execute(f"LISTEN {db.OUTBOX_CHANNEL}")
        self.arrivals: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            for _ in self.conn.notifies(timeout=0.1):
                self.arrivals.append(time.time())

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.conn.close()


def _rows(url: str, query: str) -> list[dict[str, Any]]:
    with psycopg.connect(scratch.dsn(url), autocommit=True) as conn:
        cursor = conn.cursor(row_factory=psycopg.rows.dict_row)
        return cursor.execute(query).fetchall()


def _match_notifications(outbox: list[dict[str, Any]], arrivals: list[float], ids: set[str]) -> dict[str, float]:
    """Pair the k-th committed outbox transaction of a database with the k-th notification.

    The transactions are those for the pipelines `ids`, run while the notifications were listened to.

    Every outbox-writing transaction sends exactly one notification after its commit, and
    in a database one transaction follows the other while one pipeline runs at a time, so
    the orders agree. Returns nothing if the counts differ (a pairing would be a guess).
    """
    committed = sorted(
        (row["committed"], str(row["event_id"]))
        for row in outbox
        if row["committed"] is not None and row["pipeline_id"] in ids
    )
    if len(committed) != len(arrivals):
        scratch.log.warning("notify clock: %d commits, %d notifications; not paired", len(committed), len(arrivals))
        return {}
    return {event_id: arrival for (_, event_id), arrival in zip(committed, sorted(arrivals), strict=True)}


def analyse_idle(
    urls: dict[str, str],
    unobserved: list[str],
    observed: list[str],
    streamed: list[float],
    tapped: dict[str, float],
    arrivals: dict[str, list[float]],
) -> dict[str, Any]:
    """Latencies of the `unobserved` pipelines; the parts of a handoff from the `observed` ones.

    Both are pipeline ids, each pipeline run one at a time; `streamed`: each unobserved pipeline's seconds from its
    POST to its terminal event on the client's event stream.
    """
    ids = set(unobserved)
    observed_ids = set(observed)
    events: dict[str, dict[str, Any]] = {}  # event id -> producer side
    received: dict[str, dict[str, float]] = {
        svc: {} for svc in topology.WITH_DATABASE
    }  # consumer -> event id -> handler start
    notified: dict[str, float] = {}
    for svc, url in urls.items():
        outbox = _rows(
            url,
            "SELECT o.event_id, o.pipeline_id, o.routing_key, o.created_at, o.published_at,"
            " c.committed_at FROM outbox o LEFT JOIN bench_commit c USING (event_id)",
        )
        for row in outbox:
            row["committed"] = epoch(row["committed_at"])
        notified.update(_match_notifications(outbox, arrivals[svc], observed_ids))
        for row in outbox:
            event_id = str(row["event_id"])
            events[event_id] = {
                "event_id": event_id,
                "service": svc,
                "type": row["routing_key"],
                "pipeline_id": row["pipeline_id"],
                "created": epoch(row["created_at"]),
                "committed": row["committed"],
                "published": epoch(row["published_at"]),
                "notified": notified.get(event_id),
                "tapped": tapped.get(event_id),
            }
        for row in _rows(url, "SELECT event_id, received_at FROM inbox"):
            received[svc][str(row["event_id"])] = row["received_at"].timestamp()

    # Per database: when each row was on the broker but not yet confirmed to the relay.
    in_flight: dict[str, list[tuple[str, float, float]]] = {svc: [] for svc in topology.WITH_DATABASE}
    for event in events.values():
        if event["tapped"] is not None and event["published"] is not None:
            in_flight[event["service"]].append((event["event_id"], event["tapped"], event["published"]))

    def hops(kinds: Iterable[tuple[str, str, str]], ids: set[str] = ids) -> dict[str, latency.Summary]:
        parts: dict[str, list[float]] = {
            k: []
            for k in (
                "total",
                "from_tx_start",
                "commit_to_notify",
                "notify_to_broker",
                "broker_to_handler",
                "confirmed",
                "total_while_relay_awaited_confirm",
            )
        }
        for event in events.values():
            if event["pipeline_id"] not in ids:
                continue
            for kind, producer, consumer in kinds:
                if event["type"] != kind or event["service"] != producer:
                    continue
                start = received[consumer].get(event["event_id"])
                if start is None or event["committed"] is None:
                    continue
                parts["total"].append(start - event["committed"])
                parts["from_tx_start"].append(start - event["created"])
                if event["published"] is not None:
                    parts["confirmed"].append(event["published"] - event["committed"])
                if event["notified"] is not None and event["tapped"] is not None:
                    parts["commit_to_notify"].append(event["notified"] - event["committed"])
                    parts["notify_to_broker"].append(event["tapped"] - event["notified"])
                    parts["broker_to_handler"].append(start - event["tapped"])
                    if _relay_was_waiting(event, in_flight[producer]):
                        parts["total_while_relay_awaited_confirm"].append(start - event["committed"])
        return {name: latency.summary(latency.ms(values)) for name, values in parts.items()}

    projection_kinds = [
        (f"{stage}.{fact}", stage, "api") for stage in topology.STAGES for fact in ("started", "completed")
    ]
    result: dict[str, Any] = {
        "pipelines": len(unobserved),
        "handoff_stages": hops(handoffs.CHAIN[:3]),
        "handoff_per_hop": {kind: hops([(kind, p, c)]) for kind, p, c in handoffs.CHAIN},
        "handoff_to_projection": hops(projection_kinds),
        "observed": {
            "pipelines": len(observed),
            "handoff_stages": hops(handoffs.CHAIN[:3], observed_ids),
            "handoff_per_hop": {kind: hops([(kind, p, c)], observed_ids) for kind, p, c in handoffs.CHAIN},
            "handoff_to_projection": hops(projection_kinds, observed_ids),
        },
    }
    # End to end, from the api database's projection and from the client's event stream.
    result["e2e_projection_ms"] = end_to_end(urls["api"], ids)
    result["e2e_client_ms"] = latency.summary(latency.ms(streamed))
    # Inside each stage, from the handler's transaction (jobs.created_at): the attempt claimed, the `started`
    # event committed (the end of that transaction, unless the claim came later), the outcome's recording
    # begun (attempts.finished_at, now() of the recording transaction), the `completed` event committed.
    inside: dict[str, Any] = {}
    for stage in topology.STAGES:
        jobs = _rows(
            urls[stage],
            "SELECT j.pipeline_id, j.created_at, a.started_at, a.finished_at FROM jobs j"
            " JOIN attempts a ON a.job_id = j.id AND a.number = 1",
        )
        committed = {
            fact: {
                e["pipeline_id"]: e["committed"]
                for e in events.values()
                if e["service"] == stage and e["type"] == f"{stage}.{fact}" and e["committed"] is not None
            }
            for fact in ("started", "completed")
        }
        steps: dict[str, list[float]] = {"claim": [], "started": [], "recording": [], "completed": []}
        for job in jobs:
            pipeline = job["pipeline_id"]
            if pipeline not in ids or pipeline not in committed["completed"] or pipeline not in committed["started"]:
                continue
            begun = job["created_at"].timestamp()
            steps["claim"].append(job["started_at"].timestamp() - begun)
            steps["started"].append(committed["started"][pipeline] - begun)
            steps["recording"].append(job["finished_at"].timestamp() - begun)
            steps["completed"].append(committed["completed"][pipeline] - begun)
        inside[stage] = {
            "handler_to_claim_ms": latency.summary(latency.ms(steps["claim"])),
            "handler_to_started_commit_ms": latency.summary(latency.ms(steps["started"])),
            "handler_to_recording_ms": latency.summary(latency.ms(steps["recording"])),
            "handler_to_completed_commit_ms": latency.summary(latency.ms(steps["completed"])),
        }
    result["inside_stage"] = inside
    result["notify_paired"] = bool(notified)
    return result


def end_to_end(api_url: str, ids: set[str]) -> latency.Summary:
    """`pipelines.finished_at - created_at` of these pipelines in the gateway's database.

    From the transaction that accepted the POST to the projection's that recorded the pipeline's end.
    """
    with psycopg.connect(scratch.dsn(api_url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT created_at, finished_at FROM pipelines WHERE id = ANY(%s::uuid[]) AND finished_at IS NOT NULL",
            (list(ids),),
        ).fetchall()
    return latency.summary(latency.ms([finished.timestamp() - created.timestamp() for created, finished in rows]))


def _relay_was_waiting(event: dict[str, Any], in_flight: list[tuple[str, float, float]]) -> bool:
    """Whether the row's NOTIFY came while the relay awaited the confirm of an earlier row of its database."""
    return any(
        other != event["event_id"] and tapped < event["notified"] < confirmed for other, tapped, confirmed in in_flight
    )
