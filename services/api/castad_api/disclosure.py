"""What a caller is shown of the gateway's internals.

An admin key is an operator's: it sees everything as it was recorded. A tenant's key sees its own
pipelines without what tells of the platform behind them:

- a worker as an opaque id (`w-` and 10 hex digits): the same for the same worker within a pipeline,
  unrelated across pipelines, so that neither host names nor the size of the fleet show;
- an error as its code and the code's public message (public_errors.py), never the stage's own text;
- a dead letter about its pipeline as the fact alone: no reason, no id, no detail (dead letters are the
  operators' business);
- the API key that acted on its pipeline only if it is one of the tenant's own (an operator's X-Castad-Actor
  is shown as given);
- no link to the operators' trace viewer;
- on the stream of every pipeline, event ids that are sealed cursors: it resumes with them, but they count
  nothing, where the entries' numbers in the whole gateway would tell the platform's volume. (An entry's
  `seq` is its number among its own pipeline's entries, for everyone.)
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import struct
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from castad_api import errors, keyring, public_errors

WORKER_HEX = 10
CURSOR_CHARS = 22  # 16 bytes, base64url without padding
_LAST_EVENT_ID = ("header", "Last-Event-ID")


@dataclasses.dataclass(frozen=True)
class Viewer:
    tenant: str | None  # None: an operator, shown everything
    keys: keyring.Keyring | None = None  # for a tenant: what names its workers and seals its cursors

    @property
    def internal(self) -> bool:
        return self.tenant is None

    def _key(self, use: str) -> bytes:
        assert self.keys is not None, "a tenant's view needs the gateway's keyring"
        return self.keys.key(use)

    def worker(self, pipeline_id: str, worker: str | None) -> str | None:
        if worker is None or self.internal:
            return worker
        mac = hmac.new(self._key("workers"), f"{pipeline_id}/{worker}".encode(), hashlib.sha256)
        return "w-" + mac.hexdigest()[:WORKER_HEX]

    def error_message(self, code: str | None, message: str | None) -> str | None:
        return message if self.internal else public_errors.message(code)

    def entry(self, pipeline_id: str, data: dict[str, Any]) -> dict[str, Any]:
        """A timeline entry's data (timeline.public's) as this viewer sees it.

        The acting key of an operator's action as `actor_key_id` and `actor_key_name`.
        """
        shown = dict(data)
        acting = shown.pop("actor_key", None)
        if isinstance(acting, dict) and (self.internal or acting.get("tenant") == self.tenant):
            shown.update(actor_key_id=acting.get("id"), actor_key_name=acting.get("name"))
        if self.internal:
            return shown
        if "worker" in shown:
            shown["worker"] = self.worker(pipeline_id, shown["worker"])
        error = shown.get("error")
        if isinstance(error, dict):
            shown["error"] = {**error, "message": public_errors.message(error.get("code"))}
        if str(shown.get("status", "")).startswith("dead_letter_"):
            for internal in ("reason", "detail", "dead_letter"):
                shown.pop(internal, None)
        return shown

    def trace_url(self, url: str | None) -> str | None:
        return url if self.internal else None

    def cursor(self, seq: int) -> str:
        """The event id of the entry numbered `seq` in the whole gateway, on the stream of every pipeline."""
        if self.internal:
            return str(seq)
        block = struct.pack(">Q", seq) + self._tag()
        sealed = self._cipher().encryptor().update(block)
        return base64.urlsafe_b64encode(sealed).decode().rstrip("=")

    def resumes_after(self, last_event_id: str | None) -> int | None:
        """The entry (numbered in the whole gateway) a stream of every pipeline resumes after.

        None: not resumed. A 422 for an id this viewer's stream could not have sent.
        """
        if not last_event_id:
            return None
        if self.internal:
            if last_event_id.isascii() and last_event_id.isdigit() and len(last_event_id) <= 18:
                return int(last_event_id)
            raise errors.invalid(_LAST_EVENT_ID, "must be an id this stream sent", last_event_id)
        try:
            if len(last_event_id) != CURSOR_CHARS:
                raise ValueError(last_event_id)
            sealed = base64.urlsafe_b64decode(last_event_id + "==")
        except (ValueError, binascii.Error):
            raise errors.invalid(_LAST_EVENT_ID, "must be an id this stream sent", last_event_id) from None
        block = self._cipher().decryptor().update(sealed)
        if len(block) != 16 or not hmac.compare_digest(block[8:], self._tag()):
            raise errors.invalid(_LAST_EVENT_ID, "must be an id this stream sent", last_event_id)
        seq: int = struct.unpack(">Q", block[:8])[0]
        return seq

    def _tag(self) -> bytes:
        """What binds a cursor to its tenant: another's does not open as one of this tenant's."""
        return hmac.new(self._key("cursor-tags"), (self.tenant or "").encode(), hashlib.sha256).digest()[:8]

    def _cipher(self) -> Cipher[modes.ECB]:
        # One block (a seq and a tag): AES as a keyed permutation of it, which ECB is for a single block.
        return Cipher(algorithms.AES(self._key("cursors")), modes.ECB())


INTERNAL = Viewer(None)
