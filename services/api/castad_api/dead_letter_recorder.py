"""The dead-letter queue moved into the gateway's database: each message recorded once, then acknowledged.

`Recorder` moves every message of the dead-letter queue into the gateway's database (a
message is acknowledged only once recorded, and recorded once however often it comes):
messages a consumer could not handle (it filed each, with the reason, and rejected it on its
own queue), messages a service's queue gave up on (taken and never acknowledged
`topology.DELIVERY_LIMIT` times: they killed or stopped their consumers), and notices of outbox
rows the relay parked. Each is described by dead_letter_rows.py and recorded by dead_letters.py.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any

import sqlalchemy as sa
from castad_runtime import amqp, backoff, db, outages, redact

from castad_api import dead_letter_rows, dead_letters

log = logging.getLogger(__name__)


class Recorder:
    """A consumer of the dead-letter queue on a thread of its own, recording each message before its ack."""

    def __init__(self, amqp_url: str, queue: str, engine: sa.Engine, body_max: int) -> None:
        self.amqp_url = amqp_url
        self.queue = queue
        self.engine = engine
        self.body_max = body_max
        self.recorded = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dead-letters", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        delays = backoff.Backoff(first_s=0.5, max_s=10.0)
        while not self._stop.is_set():
            try:
                self._consume()
            except Exception as error:
                if not outages.is_outage(error):
                    log.exception("dead-letter recorder failed; starting over")
                else:
                    log.warning("dead-letter recorder lost the broker (%s); reconnecting", redact.describe(error))
                delays.wait(self._stop)

    def _consume(self) -> None:
        connection = amqp.blocking_connection(self.amqp_url)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=20)
            for method, properties, body in channel.consume(self.queue, inactivity_timeout=0.5):
                if self._stop.is_set():
                    return
                if method is None:
                    continue
                fields = self._described(properties, body)
                if not self._record(fields):
                    return  # stopping: the message stays in the queue
                channel.basic_ack(method.delivery_tag)
        finally:
            if connection.is_open:
                connection.close()

    def _described(self, properties: Any, body: bytes) -> dict[str, Any]:
        """`describe`, or, where reading the message fails (a bug), its bare row: it must not come back for ever."""
        try:
            return dead_letter_rows.describe(properties.message_id, dict(properties.headers or {}), body, self.body_max)
        except Exception as error:
            log.exception("cannot read dead letter %s; recording it bare", properties.message_id)
            message_id = str(properties.message_id or f"sha256:{hashlib.sha256(body).hexdigest()}")
            return dead_letter_rows.bare(
                {"message_id": message_id, "body": body[: self.body_max], "body_size": len(body)}, error
            )

    def _record(self, fields: dict[str, Any]) -> bool:
        """Record through a database outage.

        False if the recorder stops first. A message that cannot be recorded as it is (a bug) is recorded bare, so
        that it does not hold up the queue behind it.
        """

        def write(row: dict[str, Any]) -> None:
            with db.transaction(self.engine) as conn:
                if dead_letters.record(conn, row) is not None:
                    self.recorded += 1

        try:
            try:
                outages.keep_trying(lambda: write(fields), "recording a dead letter", stop=self._stop, first_s=0.2)
            except outages.Stopped:
                raise
            except Exception as error:
                log.exception("cannot record dead letter %s as it is; recording it bare", fields["message_id"])
                bare = dead_letter_rows.bare(fields, error)
                outages.keep_trying(lambda: write(bare), "recording a dead letter", stop=self._stop, first_s=0.2)
        except outages.Stopped:
            return False
        return True
