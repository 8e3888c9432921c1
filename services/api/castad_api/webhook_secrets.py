"""Each tenant's webhook secrets.

Made and shown once (`castad-admin webhook-secrets`), kept sealed in the gateway's database, read by the gateway to
sign the tenant's notices.

A secret is `whsec_` and the base64 of 32 random bytes. Standard Webhooks signs with HMAC-SHA256 (`v1`),
a symmetric scheme: whoever verifies holds the very secret that signs, and the gateway must read it to
sign, so it cannot keep only a hash. It keeps it sealed instead: AES-256-GCM with
CASTAD_API_WEBHOOK_SECRETS_KEY, the tenant and the secret's id as associated data, so a copy of the
database reveals no secret and a sealed secret moved to another tenant's row does not open. (The
specification's asymmetric `v1a`, ed25519, would let receivers hold only a public key, but its reference
libraries, which the tenants' receivers use, verify `v1` only.)

Rotation: a new secret is made and the current one stays valid for an overlap; meanwhile every notice
carries a signature with each (the `webhook-signature` header is a space-separated list for exactly this),
so receivers move over without a notice lost. A rotation during an overlap ends the older secret at once:
never more than two are valid.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import os
import secrets
import uuid

import sqlalchemy as sa
from castad_runtime import db
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from castad_api import tables

PREFIX = "whsec_"
SECRET_BYTES = 32  # Standard Webhooks: at least 24
KEY_BYTES = 32  # AES-256
NONCE_BYTES = 12
DEFAULT_OVERLAP_S = 86_400.0
_secrets = tables.webhook_secrets


class Unreadable(Exception):
    """A sealed secret that does not open with this key for this tenant and id."""


class Exists(Exception):
    """The tenant has a current secret already: a new one is a rotation."""


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def decode_key(value: str) -> bytes:
    """The sealing key from its setting (base64 of 32 bytes); ValueError otherwise."""
    try:
        key = base64.b64decode(value, validate=True)
    except binascii.Error:
        key = b""
    if len(key) != KEY_BYTES:
        raise ValueError("must be the base64 of 32 bytes made at random (openssl rand -base64 32)")
    return key


@dataclasses.dataclass(frozen=True)
class Sealer:
    """Seals and opens secrets with the gateway's key."""

    key: bytes

    @classmethod
    def of(cls, setting: str) -> Sealer:
        return cls(decode_key(setting))

    def seal(self, tenant: str, secret_id: uuid.UUID, secret: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + AESGCM(self.key).encrypt(nonce, secret.encode(), _bound(tenant, secret_id))

    def open(self, tenant: str, secret_id: uuid.UUID, sealed: bytes) -> str:
        nonce, box = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:]
        try:
            return AESGCM(self.key).decrypt(nonce, box, _bound(tenant, secret_id)).decode()
        except (InvalidTag, ValueError):
            raise Unreadable(f"webhook secret {secret_id} of tenant {tenant!r} does not open with this key") from None


def _bound(tenant: str, secret_id: uuid.UUID) -> bytes:
    """What a sealed secret is bound to: its tenant (length first, so no two tenants' can meet) and its id."""
    return f"{len(tenant)}:{tenant}/{secret_id}".encode()


@dataclasses.dataclass(frozen=True)
class Made:
    secret: str  # shown once, kept only sealed
    id: uuid.UUID


_VALID = sa.or_(_secrets.c.expires_at.is_(None), _secrets.c.expires_at > sa.func.now())


def _lock_tenant(conn: sa.Connection, tenant: str) -> None:
    """One maker of a tenant's secrets at a time (two rotations at once would leave three valid)."""
    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(f"webhook-secrets/{tenant}", 0))))


def _add(conn: sa.Connection, sealer: Sealer, tenant: str) -> Made:
    secret, secret_id = new_secret(), uuid.uuid4()
    conn.execute(_secrets.insert().values(id=secret_id, tenant=tenant, sealed=sealer.seal(tenant, secret_id, secret)))
    return Made(secret, secret_id)


def create(conn: sa.Connection, sealer: Sealer, tenant: str) -> Made:
    """The tenant's first secret (or its next after every one was revoked); Exists if it has a current one."""
    _lock_tenant(conn, tenant)
    current = conn.execute(
        sa.select(_secrets.c.id).where(_secrets.c.tenant == tenant, _secrets.c.expires_at.is_(None))
    ).first()
    if current is not None:
        raise Exists(f"tenant {tenant!r} has a webhook secret already: rotate it")
    return _add(conn, sealer, tenant)


def rotate(conn: sa.Connection, sealer: Sealer, tenant: str, overlap_s: float = DEFAULT_OVERLAP_S) -> Made:
    """A new secret; the current one stays valid `overlap_s` more, one still in an earlier overlap ends now."""
    _lock_tenant(conn, tenant)
    now = sa.func.now()
    conn.execute(
        _secrets.update().where(_secrets.c.tenant == tenant, _secrets.c.expires_at > now).values(expires_at=now)
    )
    conn.execute(
        _secrets.update()
        .where(_secrets.c.tenant == tenant, _secrets.c.expires_at.is_(None))
        .values(expires_at=db.seconds_from_now(overlap_s))
    )
    return _add(conn, sealer, tenant)


def revoke(conn: sa.Connection, secret_id: uuid.UUID) -> bool:
    """End a secret now (an overlap ended early, or a secret that leaked); False if there is no such secret."""
    ends = sa.func.least(sa.func.coalesce(_secrets.c.expires_at, sa.func.now()), sa.func.now())
    return conn.execute(_secrets.update().where(_secrets.c.id == secret_id).values(expires_at=ends)).rowcount == 1


@dataclasses.dataclass(frozen=True)
class Listed:
    """A secret as listed, never its value: valid until `expires_at` (None: until rotated)."""

    id: uuid.UUID
    tenant: str
    created_at: dt.datetime
    expires_at: dt.datetime | None


def listing(conn: sa.Connection, tenant: str | None = None) -> list[Listed]:
    """Every secret (never its value), a tenant's or everyone's, by tenant then age."""
    query = sa.select(_secrets.c.id, _secrets.c.tenant, _secrets.c.created_at, _secrets.c.expires_at)
    if tenant is not None:
        query = query.where(_secrets.c.tenant == tenant)
    return [Listed(**row._asdict()) for row in conn.execute(query.order_by(_secrets.c.tenant, _secrets.c.created_at))]


def has_valid(conn: sa.Connection, tenant: str) -> bool:
    found = conn.execute(sa.select(_secrets.c.id).where(_secrets.c.tenant == tenant, _VALID).limit(1)).first()
    return found is not None


def signing(conn: sa.Connection, sealer: Sealer, tenant: str) -> list[str]:
    """The tenant's valid secrets, newest first: each signs its notices. Unreadable if one does not open."""
    rows = conn.execute(
        sa.select(_secrets.c.id, _secrets.c.sealed)
        .where(_secrets.c.tenant == tenant, _VALID)
        .order_by(_secrets.c.created_at.desc())
    )
    return [sealer.open(tenant, row.id, bytes(row.sealed)) for row in rows]
