"""Keys the gateway makes for itself and keeps in its own database, the same for every replica.

Every replica, and every restart, uses the same keys: what names a worker opaquely and seals a tenant's stream
cursors (disclosure.py).

One root of 32 random bytes, made by the first gateway that needs it; each use gets a key of its own
derived from it (HMAC-SHA256 of the use's name). Read once per process, on first use.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading

import sqlalchemy as sa
from castad_runtime import db
from sqlalchemy.dialects.postgresql import insert as pg_insert

from castad_api import tables

ROOT = "root"
_keys = tables.gateway_keys


class Keyring:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._root: bytes | None = None
        self._lock = threading.Lock()

    def key(self, use: str) -> bytes:
        """The key of `use` (a name: "workers", "cursors", ...)."""
        return hmac.new(self._root_key(), use.encode(), hashlib.sha256).digest()

    def _root_key(self) -> bytes:
        with self._lock:
            if self._root is None:
                with db.transaction(self.engine) as conn:
                    made = pg_insert(_keys).values(name=ROOT, secret=secrets.token_bytes(32))
                    conn.execute(made.on_conflict_do_nothing(index_elements=[_keys.c.name]))
                    self._root = bytes(conn.execute(sa.select(_keys.c.secret).where(_keys.c.name == ROOT)).scalar_one())
            return self._root
