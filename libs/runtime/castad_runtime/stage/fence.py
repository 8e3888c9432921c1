"""Work leaves Castad only under a lease known to be held, and is recorded, with its key, as it leaves.

A provider's submit starts work that is paid for, and a second submit is a second job there
unless the provider can tell it is the same (docs/providers.md: none of Castad's three can).
The stage runner hands back an attempt whose lease the machinery lost, uncounted, for another
worker to claim again; so an attempt must not let its work go once it no longer holds its
job, or a worker frozen past its lease, waking while another runs the same attempt, would
submit it a second time.

Immediately before such work leaves (`Cancellation.leaving`, which `HttpProvider.submit` calls from
httpcore's trace hook as the request's headers start to be written: after the name was resolved, the
connection made and TLS set up, so a slow or frozen connect cannot carry a request past a lease), the
runner's `Fence`:
1. checks that the lease is known held for `margin_s` more by this process's clock
   (castad_runtime.stage.leases): a process frozen past its lease, or whose renewals failed
   that long, does not know it;
2. records the submission on the attempt's row with the attempt's submission key, in a statement
   that succeeds only while the claim is the job's current one and has `margin_s` of its lease
   left by the database's clock (a job canceled or taken over meanwhile sends nothing);
3. checks the lease again, the record's round trip having taken time.
When one fails the work does not leave: `Fenced` is raised, and the runner hands the attempt
back (outcome `interrupted`, code `lease_lost`, or `outage` when the database could not be
asked), not counted, as the machinery's failure it is.

What no fence closes: a worker frozen between its last check and its request's first bytes (what
lies between them: the end of the check, httpcore writing the headers and body to a socket already
connected, and the kernel sending them), and a submit whose answer is lost after the provider took
it. The next claim sends the same work again under the same key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import sqlalchemy as sa
from castad_contracts import codes

from castad_runtime import db, logs, outages, redact
from castad_runtime.stage import leases, repository
from castad_runtime.stage.repository import attempts

log = logging.getLogger(__name__)

MARGIN = 0.1  # of a lease: at least this much of it must be left when work leaves


class Fenced(Exception):
    """An attempt's work was about to leave Castad without a lease known to be held, and did not leave."""

    def __init__(self, code: codes.ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Fence:
    """What a runner checks, and records, immediately before an attempt's work leaves for its provider.

    `sent` and `fenced` are told of each submission let go or held back (metrics)."""

    def __init__(
        self,
        engine: sa.Engine,
        held: leases.Leases,
        margin_s: float,
        sent: Callable[[], None] = lambda: None,
        fenced: Callable[[], None] = lambda: None,
    ) -> None:
        self.engine = engine
        self.leases = held
        self.margin_s = margin_s
        self._sent = sent
        self._fenced = fenced

    def let_go(self, job: repository.Job) -> None:
        """Return if the claim `job`'s work may leave now, its submission recorded; raise Fenced if not."""
        if not self.leases.known_held(job, self.margin_s):
            lost = "its lease is not known to be held (its worker froze, or was cut off)"
            raise self._held_back(job, codes.ErrorCode.LEASE_LOST, lost)
        began = self.leases.clock()
        try:
            with db.transaction(self.engine) as conn:
                left_s = attempts.record_submission(conn, job, self.margin_s)
        except Exception as error:
            if not outages.is_outage(error):
                raise
            message = f"the submission could not be recorded: {redact.describe(error)}"
            raise self._held_back(job, codes.ErrorCode.OUTAGE, message) from None
        if left_s is None:
            raise self._held_back(
                job, codes.ErrorCode.LEASE_LOST, "its claim no longer holds the job (taken over, canceled, expired)"
            )
        self.leases.confirmed(job, began, left_s)
        if not self.leases.known_held(job, self.margin_s):
            self._unrecord(job)
            raise self._held_back(
                job, codes.ErrorCode.LEASE_LOST, "recording the submission took what was left of the lease"
            )
        self._sent()

    def _held_back(self, job: repository.Job, code: codes.ErrorCode, message: str) -> Fenced:
        with logs.bound(job.pipeline_id):  # the provider's thread has no log context of its own
            log.warning("attempt %d: its work held back, not sent (%s): %s", job.attempts, code, message)
        self._fenced()
        return Fenced(code, message)

    def _unrecord(self, job: repository.Job) -> None:
        """Take back the record of a submission that did not leave; a failure leaves it (and says so)."""
        try:
            with db.transaction(self.engine) as conn:
                attempts.unrecord_submission(conn, job)
        except Exception as error:
            log.warning("attempt %d: a submission that did not leave stays recorded (%s)", job.attempts, error)
