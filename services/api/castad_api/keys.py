"""API keys: who may call the gateway, for which tenant, with which scopes.

A key is `cad_` followed by 40 random URL-safe characters; it is shown once when it is made,
and only its SHA-256 is stored (a random key of that length needs no slow hash). Scopes:

- `submit`: create pipelines;
- `read`: status, listing, event streams, artifacts and webhook deliveries of the key's tenant;
- `operate`: cancel and retry the tenant's pipelines;
- `admin`: everything, every tenant, dead letters.

A tenant may hold several keys at once, so a key is rotated by making the new one, moving
clients over, then revoking the old one. Creations are limited per key and minute in the
gateway's database, so every replica of the gateway enforces one limit.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import re
import secrets
import uuid

import sqlalchemy as sa
from castad_runtime import db

from castad_api import tables

PREFIX = "cad_"
SHOWN_CHARS = 12  # the start of a key, kept to tell keys apart in listings
_FORM = re.compile(r"cad_[A-Za-z0-9_-]{40}")  # what `create` makes: PREFIX and token_urlsafe(30)


class Scope(enum.StrEnum):
    SUBMIT = "submit"
    READ = "read"
    OPERATE = "operate"
    ADMIN = "admin"


@dataclasses.dataclass(frozen=True)
class Minute:
    """A key's creations counted so far in the current minute, and the seconds left in that minute.

    The count is as the key's authentication read it.
    """

    created: int
    left_s: float

    def retry_after_s(self) -> float:
        return max(self.left_s, 1.0)


@dataclasses.dataclass(frozen=True)
class Principal:
    """The caller, as its key says."""

    key_id: uuid.UUID
    tenant: str
    scopes: frozenset[Scope]
    name: str  # what the key is for, as its maker said (castad-admin keys create --name)
    minute: Minute  # its creations so far this minute, when it was read

    @property
    def admin(self) -> bool:
        return Scope.ADMIN in self.scopes

    def may(self, scope: Scope) -> bool:
        return self.admin or scope in self.scopes

    def tenant_filter(self) -> str | None:
        """The tenant whose pipelines this caller sees; None: all of them."""
        return None if self.admin else self.tenant

    def acting(self) -> dict[str, str]:
        """The key as an operator action records it: its id and name, and its tenant (who may see them)."""
        return {"id": str(self.key_id), "name": self.name, "tenant": self.tenant}


@dataclasses.dataclass(frozen=True)
class Made:
    key: str  # the whole key: shown once, never stored
    id: uuid.UUID


def well_formed(key: str) -> bool:
    """Whether `key` has the form of the keys this gateway makes (only such a key is worth a look-up)."""
    return _FORM.fullmatch(key) is not None


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create(conn: sa.Connection, tenant: str, scopes: frozenset[Scope], name: str) -> Made:
    key = PREFIX + secrets.token_urlsafe(30)
    key_id = uuid.uuid4()
    conn.execute(
        tables.api_keys.insert().values(
            id=key_id,
            tenant=tenant,
            name=name,
            scopes=sorted(scope.value for scope in scopes),
            digest=digest(key),
            shown=key[:SHOWN_CHARS],
        )
    )
    return Made(key, key_id)


# The key, with its creations of the current minute (see `Minute`): one indexed look more, in the same statement.
_AUTHENTICATE = """
SELECT k.id, k.tenant, k.scopes, k.name, coalesce(w.count, 0) AS created,
       extract(epoch FROM date_trunc('minute', now()) + interval '1 minute' - now()) AS left_s
FROM api_keys AS k
LEFT JOIN api_key_windows AS w ON w.key_id = k.id AND w.window_start = date_trunc('minute', now())
WHERE k.digest = %s AND k.revoked_at IS NULL
"""
_COUNT_CREATION = """
INSERT INTO api_key_windows AS w (key_id, window_start, count) VALUES (%s, date_trunc('minute', now()), 1)
ON CONFLICT (key_id, window_start) DO UPDATE SET count = w.count + 1
RETURNING w.count, extract(epoch FROM w.window_start + interval '1 minute' - now())
"""


def authenticate(conn: sa.Connection, key: str) -> Principal | None:
    """The caller a key stands for; None for an unknown or revoked key (a malformed one is not looked up)."""
    if not well_formed(key):
        return None
    row = db.run(conn, _AUTHENTICATE, (digest(key),)).fetchone()
    if row is None:
        return None
    minute = Minute(row.created, float(row.left_s))
    return Principal(row.id, row.tenant, frozenset(Scope(s) for s in row.scopes), row.name, minute)


def valid(conn: sa.Connection, key_id: uuid.UUID) -> bool:
    """Whether the key is still there and not revoked (an open stream's key, looked at again)."""
    k = tables.api_keys
    found = conn.execute(sa.select(k.c.id).where(k.c.id == key_id, k.c.revoked_at.is_(None))).first()
    return found is not None


@dataclasses.dataclass(frozen=True)
class Listed:
    """A key as listed: never its digest, `shown` its first characters."""

    id: uuid.UUID
    tenant: str
    name: str
    scopes: list[str]
    shown: str
    created_at: dt.datetime
    revoked_at: dt.datetime | None


def listing(conn: sa.Connection, tenant: str | None = None) -> list[Listed]:
    k = tables.api_keys
    query = sa.select(k.c.id, k.c.tenant, k.c.name, k.c.scopes, k.c.shown, k.c.created_at, k.c.revoked_at)
    if tenant is not None:
        query = query.where(k.c.tenant == tenant)
    return [Listed(**row._asdict()) for row in conn.execute(query.order_by(k.c.tenant, k.c.created_at))]


def revoke(conn: sa.Connection, key_id: uuid.UUID) -> bool:
    """Revoke a key at once; False if there is no such key (revoking twice is fine)."""
    k = tables.api_keys
    result = conn.execute(
        k.update().where(k.c.id == key_id).values(revoked_at=sa.func.coalesce(k.c.revoked_at, sa.func.now()))
    )
    return result.rowcount == 1


def count_creation(conn: sa.Connection, key_id: uuid.UUID, per_minute: int) -> float | None:
    """Count one creation against the key's limit for this minute.

    None if it is within the limit, else the seconds until the next minute (the Retry-After).
    """
    row = db.run(conn, _COUNT_CREATION, (key_id,)).fetchone()
    assert row is not None  # an upsert returns its row
    count, left_s = row
    return None if count <= per_minute else Minute(count, float(left_s)).retry_after_s()


def forget_windows(conn: sa.Connection, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` creation counts of minutes that began more than `older_than_s` ago; how many."""
    w = tables.key_windows
    doomed = db.expired(sa.select(w.c.key_id, w.c.window_start), w.c.window_start, older_than_s, limit)
    return conn.execute(w.delete().where(sa.tuple_(w.c.key_id, w.c.window_start).in_(doomed))).rowcount
