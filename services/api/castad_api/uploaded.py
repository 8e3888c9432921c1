"""Images a tenant uploaded: every statement of the gateway on them (routes/images.py serves them)."""

from __future__ import annotations

import uuid
from collections.abc import Collection

import sqlalchemy as sa
from castad_contracts import brief, events
from castad_runtime import artifacts as artifacts_
from castad_runtime import db
from sqlalchemy.dialects import postgresql as pg

from castad_api import records, tables
from castad_api.records import columns, typed

images = tables.images
IMAGE_COLUMNS = columns(images, records.Image)


# An image is found once its file is kept, and until retention chose to delete it.
_FOUND = sa.and_(images.c.keeping_since.is_(None), images.c.deleting_since.is_(None))


def begin_image(
    conn: sa.Connection, tenant: str, sha256: str, media_type: str, size: int, width: int, height: int
) -> records.Image | None:
    """Record a tenant's upload of these bytes, before its file is kept (`image_kept`).

    A new image is not found until then. The one the tenant has already if it uploaded these bytes before, its last
    upload moved to now, which keeps retention from choosing it meanwhile. None if retention is deleting that one:
    its row goes once its file is gone.
    """
    row = conn.execute(
        pg.insert(images)
        .values(
            id=uuid.uuid4(),
            tenant=tenant,
            sha256=sha256,
            media_type=media_type,
            size=size,
            width=width,
            height=height,
            uri="",  # the store's, once kept
            keeping_since=sa.func.now(),
        )
        .on_conflict_do_update(
            constraint="images_tenant_sha256",
            set_={"uploaded_at": sa.func.now()},
            where=images.c.deleting_since.is_(None),
        )
        .returning(*IMAGE_COLUMNS)
    ).one_or_none()
    return None if row is None else typed(records.Image, row)


def image_kept(conn: sa.Connection, image_id: uuid.UUID, kept: events.Artifact) -> records.Image | None:
    """Record that an image's file is kept (found from now on); None if retention chose it, or deleted it, meanwhile."""
    row = conn.execute(
        images.update()
        .where(images.c.id == image_id, images.c.deleting_since.is_(None))
        .values(uri=kept.uri, keeping_since=None)
        .returning(*IMAGE_COLUMNS)
    ).one_or_none()
    return None if row is None else typed(records.Image, row)


def forget_image_begun(conn: sa.Connection, image_id: uuid.UUID) -> None:
    """Delete an image whose file could not be kept, unless another upload of it kept it meanwhile."""
    conn.execute(images.delete().where(images.c.id == image_id, images.c.keeping_since.is_not(None)))


def photo(image: records.Image) -> brief.Photo:
    """An image as events name it: a reference to its file in the store."""
    return brief.Photo(
        id=str(image.id),
        owner=artifacts_.image_owner(image.tenant),
        sha256=image.sha256,
        media_type=image.media_type,
        size=image.size,
    )


def get_image(conn: sa.Connection, image_id: uuid.UUID, tenant: str | None) -> records.Image | None:
    """The image, unless it is not `tenant`'s (None: anyone's), or not found (its file not kept, or being deleted)."""
    query = sa.select(*IMAGE_COLUMNS).where(images.c.id == image_id, _FOUND)
    if tenant is not None:
        query = query.where(images.c.tenant == tenant)
    row = conn.execute(query).fetchone()
    return None if row is None else typed(records.Image, row)


def get_images(conn: sa.Connection, image_ids: Collection[uuid.UUID]) -> list[records.Image]:
    """These images (those found), whoever's they are."""
    return [
        typed(records.Image, row) for row in conn.execute(sa.select(*IMAGE_COLUMNS).where(images.c.id.in_(image_ids)))
    ]


def tenant_images(conn: sa.Connection, image_ids: Collection[uuid.UUID], tenant: str) -> dict[uuid.UUID, records.Image]:
    """The found images among these that are `tenant`'s, by id, each locked (FOR KEY SHARE) until it commits.

    The lock is what keeps retention from choosing an image a pipeline is being created with: retention skips
    locked images, and checks again, once it holds the lock, that no pipeline names one. An image retention chose to
    delete is not found."""
    if not image_ids:
        return {}
    query = (
        sa.select(*IMAGE_COLUMNS)
        .where(images.c.id.in_(list(image_ids)), images.c.tenant == tenant, _FOUND)
        .with_for_update(read=True, key_share=True)
    )
    return {row.id: typed(records.Image, row) for row in conn.execute(query)}


def held(conn: sa.Connection, tenant: str, besides: str) -> tuple[int, int]:
    """How many images the tenant holds, and their bytes, but those of the bytes whose SHA-256 is `besides`."""
    count, total = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(images.c.size), 0)).where(
            images.c.tenant == tenant, images.c.sha256 != besides
        )
    ).one()
    return int(count), int(total)


# -- Retention's (retention.forget_images) ------------------------------------------------------------------------


def lock_expired(conn: sa.Connection, older_than_s: float, limit: int) -> list[uuid.UUID]:
    """Up to `limit` images last uploaded, or last found named, more than `older_than_s` ago, locked."""
    return list(conn.execute(db.expired(sa.select(images.c.id), images.c.uploaded_at, older_than_s, limit)).scalars())


def found_named(conn: sa.Connection, image_ids: Collection[uuid.UUID]) -> None:
    """Move these images as far off retention as an upload would: a pipeline or a kit names them."""
    conn.execute(images.update().where(images.c.id.in_(image_ids)).values(uploaded_at=sa.func.now()))


def choose_to_delete(conn: sa.Connection, image_ids: Collection[uuid.UUID]) -> None:
    """Mark these images chosen for deletion: none is found from this transaction's commit on."""
    conn.execute(images.update().where(images.c.id.in_(image_ids)).values(deleting_since=sa.func.now()))


def unchoose(conn: sa.Connection, image_ids: Collection[uuid.UUID]) -> None:
    """Found again: these images' files were not deleted after all."""
    conn.execute(images.update().where(images.c.id.in_(image_ids)).values(deleting_since=None))


def forget_deleted(conn: sa.Connection, image_ids: Collection[uuid.UUID]) -> None:
    """Delete the records of these images chosen for deletion, whose files are gone."""
    conn.execute(images.delete().where(images.c.id.in_(image_ids), images.c.deleting_since.is_not(None)))
