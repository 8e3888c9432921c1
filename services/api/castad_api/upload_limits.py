"""What a tenant may upload: how fast (a token bucket), and how much it may hold (images and bytes).

Both are kept in the gateway's database, as a key's creation count is (keys.py), so that every replica
of the gateway holds one limit. The bucket of a tenant is a row, taken from by one upsert: `burst`
uploads at once, then `per_minute` more a minute; an upload is counted when it comes, before its body
is read or decoded, whether it is kept or refused (a refused one cost a decode too). An upload taken
over the limit is rolled back, so refusals do not push the next upload further off.

An image is counted against its tenant's holdings when it is recorded: the tenant's uploads are
recorded one at a time (a transaction-scoped advisory lock of the tenant's), so two at once cannot
both squeeze into the last place. The same bytes again are the image the tenant holds already and
add nothing.
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from castad_runtime import db

from castad_api import errors, tables, uploaded

_TAKE = """
INSERT INTO image_upload_buckets AS b (tenant, tokens, at) VALUES (%(tenant)s, %(burst)s - 1, now())
ON CONFLICT (tenant) DO UPDATE
SET tokens = least(%(burst)s, b.tokens + greatest(0, extract(epoch FROM now() - b.at)) * %(per_s)s) - 1, at = now()
RETURNING tokens
"""


@dataclasses.dataclass(frozen=True)
class Limits:
    """A tenant's upload limits.

    CASTAD_API_IMAGE_UPLOADS_PER_MINUTE, _UPLOAD_BURST, _MAX_PER_TENANT, _MAX_BYTES_PER_TENANT.
    """

    per_minute: float
    burst: int
    max_images: int
    max_bytes: int

    @property
    def per_s(self) -> float:
        return self.per_minute / 60

    def full_after_s(self) -> float:
        """How long an untouched bucket takes to fill up from empty: then it is as good as no row."""
        return self.burst / self.per_s


class OverRate(Exception):
    """The tenant uploaded as fast as it may: the next upload may come in `wait_s`."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(wait_s)
        self.wait_s = wait_s


def take(conn: sa.Connection, tenant: str, limits: Limits) -> None:
    """Count one upload of the tenant's; OverRate (roll the transaction back) if its bucket is empty."""
    row = db.run(conn, _TAKE, {"tenant": tenant, "burst": limits.burst, "per_s": limits.per_s}).fetchone()
    assert row is not None  # an upsert returns its row
    (tokens,) = row
    if tokens < 0:
        raise OverRate(-tokens / limits.per_s)


def check_room(conn: sa.Connection, tenant: str, sha256: str, size: int, limits: Limits) -> None:
    """Make sure the tenant may hold one more image of `size` bytes; errors.Full if it may not.

    Not checked if it holds these bytes already. The tenant's other uploads are kept from being recorded until the
    transaction ends.
    """
    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(f"images/{tenant}", 0))))
    count, total = uploaded.held(conn, tenant, besides=sha256)
    if count + 1 > limits.max_images:
        raise errors.Full(
            f"this tenant holds {count} images, as many as it may (CASTAD_API_IMAGE_MAX_PER_TENANT); an image no"
            " pipeline names is deleted some time after its upload (CASTAD_API_RETENTION_IMAGES_S)"
        )
    if total + size > limits.max_bytes:
        raise errors.Full(
            f"this tenant holds {total} bytes of images and this one is {size} more than the"
            f" {limits.max_bytes} it may hold (CASTAD_API_IMAGE_MAX_BYTES_PER_TENANT); an image no pipeline names is"
            " deleted some time after its upload (CASTAD_API_RETENTION_IMAGES_S)"
        )


def forget_buckets(conn: sa.Connection, full_after_s: float, limit: int) -> int:
    """Delete up to `limit` buckets untouched for `full_after_s` (full again: as good as none); how many."""
    b = tables.upload_buckets
    doomed = db.expired(sa.select(b.c.tenant), b.c.at, full_after_s, limit)
    return conn.execute(b.delete().where(b.c.tenant.in_(doomed.scalar_subquery()))).rowcount
