"""Each tenant's brand kit: set and read through /v1/brand (routes/brand.py), and what a pipeline begins with.

A kit's logo is an image the tenant uploaded (POST /v1/images, through the same guards as a photo). Setting the kit
locks that image as creating a pipeline locks the photos it names (uploaded.tenant_images), so that retention,
which keeps an image while a kit or a pipeline shows it, cannot choose it meanwhile. A pipeline records the brand it
began with in its brief: a kit changed since does not change it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from castad_contracts import api, brief
from sqlalchemy.dialects import postgresql as pg

from castad_api import errors, records, tables, uploaded

kits = tables.brand_kits
COLUMNS = [kits.c[name] for name in ("tenant", "logo", "colors", "font", "caption_style", "updated_at")]


def kit(conn: sa.Connection, tenant: str, locked: bool = False) -> records.BrandKit | None:
    """The tenant's kit, if it set one; `locked`: its row held (FOR SHARE) until the transaction ends."""
    query = sa.select(*COLUMNS).where(kits.c.tenant == tenant)
    row = conn.execute(query.with_for_update(read=True) if locked else query).fetchone()
    return None if row is None else records.BrandKit(**row._mapping)


def save(conn: sa.Connection, tenant: str, asked: api.BrandKitRequest, key_id: uuid.UUID | None) -> records.BrandKit:
    """Set the tenant's kit to `asked`; InvalidField if its logo is not an image the tenant uploaded."""
    _logo(conn, asked.logo, tenant)
    values = {
        "logo": None if asked.logo is None else uuid.UUID(asked.logo),
        "colors": list(asked.colors),
        "font": asked.font,
        "caption_style": asked.caption_style.model_dump(mode="json"),
        "updated_by": key_id,
    }
    saved = conn.execute(
        pg.insert(kits)
        .values(tenant=tenant, **values)
        .on_conflict_do_update(index_elements=[kits.c.tenant], set_={**values, "updated_at": sa.func.now()})
        .returning(*COLUMNS)
    ).one()
    return records.BrandKit(**saved._mapping)


def delete(conn: sa.Connection, tenant: str) -> bool:
    """Remove the tenant's kit; whether it had one."""
    return bool(conn.execute(kits.delete().where(kits.c.tenant == tenant)).rowcount)


def for_pipeline(conn: sa.Connection, tenant: str) -> brief.Brand | None:
    """The tenant's kit as a pipeline made now begins with it: its logo named as a photo is, and locked as one is.

    The kit's row is held until the pipeline commits, so that a kit changed meanwhile waits for it: the logo it
    names is then still the kit's, which retention keeps. Were it not found all the same, it is left out rather
    than failing the pipeline."""
    found = kit(conn, tenant, locked=True)
    if found is None:
        return None
    logo = None
    if found.logo is not None:
        image = uploaded.tenant_images(conn, [found.logo], tenant).get(found.logo)
        logo = None if image is None else uploaded.photo(image)
    return brief.Brand(
        logo=logo,
        colors=tuple(found.colors),
        font=found.font,
        caption_style=brief.CaptionStyle.model_validate(found.caption_style),
    )


def view(found: records.BrandKit) -> api.BrandKit:
    logo = None if found.logo is None else str(found.logo)
    return api.BrandKit(
        logo=logo,
        logo_download=None if logo is None else f"/v1/images/{logo}/content",
        colors=found.colors,
        font=found.font,
        caption_style=brief.CaptionStyle.model_validate(found.caption_style),
        updated_at=found.updated_at,
    )


def _logo(conn: sa.Connection, logo: str | None, tenant: str) -> None:
    """Lock the logo's image (InvalidField unless it is one the tenant uploaded, in the words a photo's gets)."""
    if logo is not None and not uploaded.tenant_images(conn, [uuid.UUID(logo)], tenant):
        raise errors.InvalidField(("body", "logo"), f"no image {logo} was uploaded by this tenant", logo)


def showing(conn: sa.Connection, image_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Those of the images a brand kit shows as its logo (by the index brand_kits_logo; retention keeps them)."""
    return set(conn.execute(sa.select(kits.c.logo).where(kits.c.logo.in_(list(image_ids)))).scalars())
