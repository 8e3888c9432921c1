"""A consuming replica says which release it runs and which event versions it reads, in its own database.

During a rollout, release N and N+1 of a service consume the same queue, and their producers may already run
either. An event that only a newer version of its type can carry (a brief with a field the release before does not
know) must not reach a service none of whose replicas reads it: the consumer would hold it for an hour, then
dead-letter it. So each replica keeps a row in its service's `replicas` table, renewed every `RENEW_S`: its
release, and for each event type it handles the newest version its contracts read. The relays read those rows
before they publish (castad_relay.readers) and hold an event in its outbox, visibly and uncharged, until a replica
that reads it runs; so no release has to be rolled out consumers first.

A replica's row stops being live when it stops (it stays, so that while no replica runs the one seen last still
says what the service reads); a row not renewed for `LIVE_S` is a replica gone (killed, frozen or cut off), and
one not renewed for `FORGOTTEN_S` is deleted by the next replica that renews its own.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping

import sqlalchemy as sa

from castad_runtime import db, outages, redact

log = logging.getLogger(__name__)

RENEW_S = 10.0
LIVE_S = 3 * RENEW_S  # a row renewed this lately is a live replica's
FORGOTTEN_S = 7 * 24 * 3600.0  # a row not renewed this long is deleted (its replica is long gone)

_RENEW = sa.text(
    """
    INSERT INTO replicas (replica, release, reads) VALUES (:replica, :release, CAST(:reads AS jsonb))
    ON CONFLICT (replica) DO UPDATE SET release = excluded.release, reads = excluded.reads, seen_at = now()
    """
)
_FORGET = sa.text("DELETE FROM replicas WHERE seen_at < now() - make_interval(secs => :forgotten_s)")
# A stopped replica's row stays, no longer live: while none is, the one seen last still says what the service reads.
_WITHDRAW = sa.text(
    "UPDATE replicas SET seen_at = least(seen_at, now() - make_interval(secs => :live_s)) WHERE replica = :replica"
)


class Announcer:
    """Keeps this replica's row in `replicas` while it runs (a thread), and marks it no longer live when it stops."""

    def __init__(
        self, engine: sa.Engine, replica: str, release: str, reads: Mapping[str, int], renew_s: float = RENEW_S
    ) -> None:
        self.engine = engine
        self.replica = replica
        self.release = release
        self.reads = dict(sorted(reads.items()))
        self.renew_s = renew_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="announcement", daemon=True)
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and make the row no longer live (a database out now leaves it to end within `LIVE_S`)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        try:
            with db.transaction(self.engine) as conn:
                conn.execute(_WITHDRAW, {"replica": self.replica, "live_s": LIVE_S})
        except sa.exc.SQLAlchemyError as error:
            log.warning("replica %s: its row stays until it ends (%s)", self.replica, redact.describe(error))

    def threads(self) -> list[threading.Thread]:
        return [self._thread] if self._thread.ident is not None else []

    def renew(self) -> None:
        """Write or renew the row, and delete the rows of replicas long gone."""
        with db.transaction(self.engine) as conn:
            conn.execute(_FORGET, {"forgotten_s": FORGOTTEN_S})
            params = {"replica": self.replica, "release": self.release, "reads": json.dumps(self.reads)}
            conn.execute(_RENEW, params)

    def _loop(self) -> None:
        while True:
            try:
                self.renew()
            except sa.exc.SQLAlchemyError as error:
                if not outages.is_outage(error) and not isinstance(error, sa.exc.ProgrammingError):
                    raise
                # An outage, or a database not migrated to this release yet: the relays go on as if no word came.
                if not self._failing:
                    log.warning("replica %s: cannot say what it reads (%s)", self.replica, redact.describe(error))
                self._failing = True
            else:
                if self._failing:
                    log.info("replica %s: says what it reads again", self.replica)
                self._failing = False
            if self._stop.wait(self.renew_s):
                return
