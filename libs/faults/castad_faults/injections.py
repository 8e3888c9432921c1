"""Faults that are messages or rows.

Poison in every queue, copies of real events, an outbox row the relay refuses (of a type no service produces).

Every poison message carries a marker of its own (a UUID in its body), so that the checker
can tell the dead-letter queue holds exactly the poison injected, each with its reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import threading
import uuid
from collections import deque

import pika
import psycopg
from castad_contracts import events, topology
from castad_runtime import amqp
from castad_testkit import scratch

# The event type each service's queue is bound to, to send it as a version it cannot know yet.
TRIGGERS = {topology.GATEWAY: "lyric.started", **{stage.value: trigger for stage, trigger in events.TRIGGERS.items()}}
EXPECTED_REASON = {"garbage": "not JSON", "unknown_type": "no handler", "newer_version": "is newer than"}
PROBE_TYPE = "harness.fault_probe"  # an event type no service produces: the relay parks it at once


@dataclasses.dataclass(frozen=True)
class Poison:
    queue: str
    kind: str  # a key of EXPECTED_REASON
    marker: str
    body: bytes


def poison_for(topo: topology.Topology) -> list[Poison]:
    """Three kinds of poison per service queue: undecodable, of an unknown type, of a newer version."""
    made = []
    for service in topo.services:
        queue = topo.queue(service)
        marker = str(uuid.uuid4())
        made.append(Poison(queue, "garbage", marker, f"\x00\xff poison {marker} {{not json".encode("latin-1")))
        for kind, event_type, version in (
            ("unknown_type", "harness.exploded", 1),
            ("newer_version", TRIGGERS[service], 99),
        ):
            marker = str(uuid.uuid4())
            document = {
                "specversion": "1.0",
                "id": marker,
                # its type's producer's: a consumer dead-letters an event from anyone else at once
                "source": topology.SOURCES.get(topology.PRODUCERS.get(event_type, ""), "/castad/fault-harness"),
                "type": event_type,
                "subject": str(uuid.uuid4()),
                "time": "2026-01-01T00:00:00Z",
                "datacontenttype": "application/json",
                "schemaversion": version,
                "data": {"from": "the fault harness"},
            }
            made.append(Poison(queue, kind, marker, json.dumps(document).encode()))
    return made


def publish_poison(poison: list[Poison], amqp_url: str) -> None:
    with _channel(amqp_url) as channel:
        for each in poison:
            channel.basic_publish("", each.queue, each.body, pika.BasicProperties(delivery_mode=2), mandatory=True)


class Tap:
    """Sees every event the exchange routes to a service, in the order it routes them.

    A quorum queue of the harness bound as every service's queue is, read for as long as the run lasts, across the
    loss of any node (its consumer connects again, and what it had not acknowledged comes again). Keeps the ids in
    that order, and copies of the latest `keep` events to send again (`republish`).
    """

    def __init__(self, topo: topology.Topology, queue: str, keep: int, amqp_url: str) -> None:
        self.exchange = topo.exchange
        self.queue = queue
        self.amqp_url = amqp_url
        self.kept: deque[tuple[str, pika.BasicProperties, bytes]] = deque(maxlen=keep)
        self.routed: list[str] = []  # message ids (the relay's: event ids), in the order the queue had them
        with _channel(amqp_url) as channel:
            channel.queue_declare(queue, durable=True, arguments={"x-queue-type": topology.QUEUE_TYPE})
            # What the services subscribe to, no more: an event no service takes must stay unroutable.
            for key in {key for service in topo.services for key in topo.bindings(service)}:
                channel.queue_bind(queue, self.exchange, routing_key=key)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._consume()
            except pika.exceptions.AMQPError:
                self._stop.wait(0.5)  # its node went: the next one

    def _consume(self) -> None:
        connection = amqp.blocking_connection(self.amqp_url)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=200)
            for method, properties, body in channel.consume(self.queue, inactivity_timeout=0.2):
                if self._stop.is_set():
                    return
                if method is None:
                    continue
                self.routed.append(str(properties.message_id))
                self.kept.append((method.routing_key, properties, body))
                channel.basic_ack(method.delivery_tag)
        finally:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()

    def republish(self) -> int:
        """Send every kept event again, as a redelivery would bring it: the same id, body and routing."""
        copies = list(self.kept)
        with _channel(self.amqp_url) as channel:
            for routing_key, properties, body in copies:
                channel.basic_publish(self.exchange, routing_key, body, properties)
        return len(copies)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with contextlib.suppress(pika.exceptions.AMQPError), _channel(self.amqp_url) as channel:
            channel.queue_delete(self.queue)


def add_unroutable_row(api_database_url: str, due_in_s: float = 0.0) -> str:
    """Add an outbox row the relay parks at once (once it is due, `due_in_s` from now) to the gateway's database.

    Its event id. Its event type is one no service produces, so no queue is bound to it either.
    """
    event_id, pipeline_id = str(uuid.uuid4()), str(uuid.uuid4())
    document = {
        "specversion": "1.0",
        "id": event_id,
        "source": "/castad/fault-harness",
        "type": PROBE_TYPE,
        "subject": pipeline_id,
        "time": "2026-01-01T00:00:00Z",
        "datacontenttype": "application/json",
        "schemaversion": 1,
        "data": {},
    }
    with psycopg.connect(scratch.dsn(api_database_url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (event_id, pipeline_id, routing_key, envelope, retry_at)"
            " VALUES (%s, %s, %s, %s, CASE WHEN %s > 0 THEN now() + make_interval(secs => %s) END)",
            (event_id, pipeline_id, PROBE_TYPE, json.dumps(document), due_in_s, due_in_s),
        )
        conn.execute("SELECT pg_notify('castad_outbox', '')")
    return event_id


def take_dead_letters(queue: str, amqp_url: str) -> list[tuple[bytes, dict[str, object]]]:
    """Every message in the dead-letter queue (removed from it), with its headers."""
    taken: list[tuple[bytes, dict[str, object]]] = []
    with _channel(amqp_url) as channel:
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return taken
            taken.append((body, dict(properties.headers or {})))


class _channel:
    """A confirm-mode channel on a connection of its own, straight to the broker (not through the proxies)."""

    def __init__(self, amqp_url: str) -> None:
        self.amqp_url = amqp_url

    def __enter__(self) -> pika.adapters.blocking_connection.BlockingChannel:
        self.connection = amqp.blocking_connection(self.amqp_url)
        channel = self.connection.channel()
        channel.confirm_delivery()
        return channel

    def __exit__(self, *exc: object) -> None:
        self.connection.close()


def ffmpeg_children(pid: int) -> list[int]:
    """Pids of the ffmpeg processes that process `pid` started (in sessions of their own)."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            command = (proc / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"ffmpeg" in command:
            found.append(int(proc.name))
    return found


def pipeline_of(pid: int) -> str | None:
    """The pipeline whose video an ffmpeg process writes (its output path holds the pipeline id)."""
    try:
        arguments = (pathlib.Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for argument in arguments:
        path = pathlib.Path(argument.decode(errors="replace"))
        if path.name.startswith(".video.attempt"):
            return path.parent.name
    return None


def song_seconds_of(pid: int) -> float:
    """About how long the song an ffmpeg process renders lasts, by its size; 0 if its song is not found.

    The music API's MP3s take about 8 KB a second, a WAV 88 KB.
    """
    try:
        arguments = (pathlib.Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return 0.0
    inputs = [arguments[i + 1] for i, argument in enumerate(arguments[:-1]) if argument == b"-i"]
    for argument in inputs:
        path = pathlib.Path(argument.decode(errors="replace"))
        if path.suffix in (".mp3", ".wav"):
            try:
                return path.stat().st_size / (8_000 if path.suffix == ".mp3" else 88_200)
            except OSError:
                return 0.0
    return 0.0
