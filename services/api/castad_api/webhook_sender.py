"""A notice's try: POSTed through the guarded client, signed as Standard Webhooks, within a deadline.

A notice goes through the guarded client (castad_runtime.outbound): to an https URL, never to a
private, loopback, link-local or otherwise non-public address (the host is resolved, every address
checked, IPv4 inside IPv6 too, and the connection made to the checked address, so a second lookup
cannot change it), unless CASTAD_API_WEBHOOK_ALLOW_PRIVATE is set (plain http and private
addresses, for local receivers). A refused destination fails the delivery at once. Redirects are
not followed (a 3xx answer is a failed try), as Standard Webhooks advises; an answer's body is
read up to a few kilobytes, and a try that takes longer than its deadline is a failed try, so
no receiver holds a place for longer. The `webhook-signature` header is the HMAC-SHA256 of the notice with each
valid `whsec_` secret of the pipeline's tenant (webhook_secrets.py, https://www.standardwebhooks.com/).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
from castad_runtime import outbound, redact
from castad_runtime.stage import cancellation

log = logging.getLogger(__name__)
ANSWER_MAX_BYTES = 16_384
REFUSED = "the destination is not allowed: not https, or not a public address"


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """A signature: `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body`."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return f"v1,{base64.b64encode(mac).decode()}"


def signatures(secrets: Sequence[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header: a signature with each secret, space-separated (a rotation's overlap)."""
    return " ".join(sign(secret, message_id, timestamp, body) for secret in secrets)


@dataclasses.dataclass(frozen=True)
class Outcome:
    status_code: int | None = None
    error: str | None = None
    blocked: bool = False

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class Sender:
    """POSTs a signed notice through the guarded client, each try within `deadline_s` as a whole.

    Connections are not kept: a receiver gets one notice now and then, not a stream of them."""

    def __init__(self, allow_private: bool, timeout_s: float, transport: Any = None) -> None:
        self._timeout_s = timeout_s
        self.deadline_s = 2 * timeout_s + 5  # the name's lookup, the connection, the answer: shorter than a lease
        self._client = outbound.Client(
            allow_private=allow_private, timeout_s=timeout_s, keepalive=False, transport=transport
        )

    def close(self) -> None:
        self._client.close()

    def send(self, message_id: str, url: str, body: bytes, secrets: Sequence[str]) -> Outcome:
        """One try, signed with each of `secrets`.

        A receiver (or its name server) slower than the deadline is a failed try: the call is left to end by its
        own timeouts while the deliverer goes on.
        """
        watch = cancellation.Cancellation()
        timer = threading.Timer(self.deadline_s, watch.cancel, args=(cancellation.Reason.TIMEOUT,))
        timer.start()
        try:
            return watch.call(lambda: self._send(message_id, url, body, secrets))
        except cancellation.Cancelled:
            return Outcome(error=f"no answer within {self.deadline_s:g} s")
        finally:
            timer.cancel()

    def _send(self, message_id: str, url: str, body: bytes, secrets: Sequence[str]) -> Outcome:
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": "castad-webhooks",
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signatures(secrets, message_id, timestamp, body),
        }
        deadline = time.monotonic() + self._timeout_s  # for the whole exchange, the answer's headers too
        try:
            with self._client.stream("POST", url, content=body, headers=headers, deadline=deadline) as response:
                status = response.status_code
                # The answer's status is what counts: a body too large or encoded is not read on.
                with contextlib.suppress(outbound.TooLarge, outbound.EncodingRefused):
                    outbound.read(response, ANSWER_MAX_BYTES, deadline)
        except outbound.Refused as error:  # a destination no try can send to
            log.warning("notice %s not sent: %s", message_id, error)
            return Outcome(error=REFUSED, blocked=True)
        except (httpx.HTTPError, OSError) as error:
            return Outcome(error=redact.describe(error))
        if 300 <= status < 400:
            return Outcome(status_code=status, error=f"answered {status}: redirects are not followed")
        return Outcome(status_code=status)
