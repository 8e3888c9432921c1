"""Retention of uploaded images on a real PostgreSQL.

An image no pipeline names goes, record and file, some time after its last upload; one a pipeline names stays while
the pipeline does; and neither a pipeline created, nor the same bytes uploaded again, at the moment retention
deletes the image ends with a record whose file is gone.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from castad_api import brands, creation, deps, errors, notifications, repository, tables, upload_limits, uploaded
from castad_api import retention as api_retention
from castad_api import settings as api_settings
from castad_api.routes import images as image_routes
from castad_contracts import api, brief
from castad_runtime import artifacts, db, images, outages
from castad_runtime.artifacts import volume

from tests.integration.helpers import indexes_used, statements_of
from tests.support.installation import Installation
from tests.unit.test_image_uploads import photo

pytestmark = pytest.mark.integration

DAY = dt.timedelta(days=1)
TENANT = "hana"


@pytest.fixture
def gw(installation: Installation, engines: Mapping[str, sa.Engine]) -> deps.Gateway:
    """The gateway's parts an upload and retention use, with the default settings.

    An image no pipeline names is kept 7 days after its last upload.
    """
    url = installation.database_urls["api"]
    config = api_settings.ApiSettings(database_url=url, artifacts_dir=installation.artifacts_dir)
    store = volume.VolumeStore(installation.artifacts_dir)
    return deps.Gateway(config, engines["api"], notifications.PipelineNotifications(url), store)


def upload(gw: deps.Gateway, width: int, uploaded_ago: dt.timedelta = dt.timedelta(0)) -> uuid.UUID:
    """An image of the tenant's `width` pixels wide, kept as an upload keeps it, last uploaded `uploaded_ago`."""
    cleaned = images.clean(photo(size=(width, 16)), max_bytes=1 << 20, max_pixels=1 << 20)
    image_id = uuid.UUID(image_routes.keep(gw, TENANT, cleaned).id)
    i = tables.images
    with db.transaction(gw.engine) as conn:
        conn.execute(i.update().where(i.c.id == image_id).values(uploaded_at=repository.now(conn) - uploaded_ago))
    return image_id


def create(conn: sa.Connection, *image_ids: uuid.UUID) -> uuid.UUID:
    """A pipeline of the tenant's whose brief names the images."""
    body = api.PipelineRequest(customer_name="바다책방", region="속초", photos=[str(i) for i in image_ids])
    return creation.create(conn, body, TENANT, str(uuid.uuid4()), 7200).pipeline_id


def kept(gw: deps.Gateway) -> dict[uuid.UUID, bool]:
    """Each image recorded, and whether its file is in the store."""
    with gw.engine.connect() as conn:
        rows = uploaded.get_images(conn, conn.execute(sa.select(tables.images.c.id)).scalars().all())
    return {row.id: _there(gw.store, uploaded.photo(row)) for row in rows}


def files(installation: Installation) -> int:
    """How many files the store holds under its images, temporary ones too."""
    return sum(1 for path in (installation.artifacts_dir / "images").rglob("*") if path.is_file())


def _there(store: artifacts.ArtifactStore, photo: brief.Photo) -> bool:
    try:
        store.serve_image(photo)
    except artifacts.ArtifactMissing:
        return False
    return True


def pipeline_gone(gw: deps.Gateway, pipeline_id: uuid.UUID, image_id: uuid.UUID) -> None:
    """The pipeline deleted by retention (90 days after it ended), and the image it named due to be looked at again."""
    p, i = tables.pipelines, tables.images
    with db.transaction(gw.engine) as conn:
        ended = repository.now(conn) - 91 * DAY
        conn.execute(p.update().where(p.c.id == pipeline_id).values(status="CANCELED", finished_at=ended))
        assert repository.forget_ended(conn, gw.config.retention_pipelines_s, 10) == 1
        conn.execute(i.update().where(i.c.id == image_id).values(uploaded_at=repository.now(conn) - 8 * DAY))


def prune(gw: deps.Gateway, store: Any = None) -> int:
    """One batch of the images' retention, with the gateway's store or `store` (anything that deletes images)."""
    return api_retention.forget_images(gw.engine, store or gw.store, gw.config.retention_images_s, 100)


class Held:
    """A store whose deletions of images wait, once begun (`begun`), until `go` is set."""

    def __init__(self, store: artifacts.ArtifactStore) -> None:
        self.store = store
        self.begun, self.go = threading.Event(), threading.Event()

    def delete_image(self, photo: brief.Photo) -> None:
        self.begun.set()
        assert self.go.wait(10)
        self.store.delete_image(photo)


def test_an_image_no_pipeline_names_goes_with_its_file_and_one_a_pipeline_names_stays_while_the_pipeline_does(
    gw, installation
):
    upload(gw, 17, 8 * DAY)  # no pipeline names it: it goes
    recent, named = upload(gw, 18, 6 * DAY), upload(gw, 19, 8 * DAY)
    with db.transaction(gw.engine) as conn:
        pipeline_id = create(conn, named)
    again = upload(gw, 20, 30 * DAY)
    assert upload(gw, 20) == again  # the same bytes uploaded again: kept 7 days from now

    with statements_of(gw.engine) as statements:
        assert prune(gw) == 2  # the one deleted, and the one found named

    assert kept(gw) == {recent: True, named: True, again: True} and files(installation) == 3
    assert {"images_uploaded", "pipelines_photos"} <= indexes_used(gw.engine, statements)
    assert prune(gw) == 0  # the one found named is looked at again a period later
    # Once the pipeline is deleted (90 days after it ended), so is the image it named, when it is looked at again.
    pipeline_gone(gw, pipeline_id, named)
    assert prune(gw) == 1
    assert kept(gw) == {recent: True, again: True} and files(installation) == 2


def test_an_image_a_pipeline_is_being_created_with_is_skipped_then_kept(gw):
    image = upload(gw, 17, 8 * DAY)

    with db.transaction(gw.engine) as conn:
        create(conn, image)
        assert prune(gw) == 0  # locked by the creation, not yet committed
    assert prune(gw) == 1  # found named: kept

    assert kept(gw) == {image: True}


def test_a_pipeline_created_while_retention_deletes_its_image_is_refused_naming_the_photo(gw):
    image = upload(gw, 17, 8 * DAY)
    held = Held(gw.store)

    def created() -> uuid.UUID:
        with db.transaction(gw.engine) as conn:
            return create(conn, image)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pruning = pool.submit(prune, gw, held)
        assert held.begun.wait(10)  # retention chose the image, and deletes its file outside any transaction
        with pytest.raises(errors.InvalidField, match=f"no image {image} was uploaded"):
            pool.submit(created).result(5)  # nothing to wait for: the image is not found any more
        with gw.engine.connect() as conn:
            assert uploaded.get_image(conn, image, TENANT) is None
        held.go.set()
        assert pruning.result(10) == 1
    assert kept(gw) == {}


def test_the_same_bytes_uploaded_while_retention_deletes_them_are_kept_anew_with_their_file(gw, installation):
    image = upload(gw, 17, 8 * DAY)
    held = Held(gw.store)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pruning = pool.submit(prune, gw, held)
        assert held.begun.wait(10)
        uploading = pool.submit(upload, gw, 17)
        time.sleep(0.3)
        assert not uploading.done()  # the upload waits for the deletion of the image it would record again
        held.go.set()
        assert pruning.result(10) == 1
        again = uploading.result(10)

    assert again != image and kept(gw) == {again: True} and files(installation) == 1


def test_a_store_that_fails_stops_the_batch_and_what_it_deleted_before_is_recorded_deleted(gw):
    first, second = upload(gw, 17, 9 * DAY), upload(gw, 18, 8 * DAY)

    class Failing:
        def __init__(self) -> None:
            self.deleted = 0

        def delete_image(self, photo: brief.Photo) -> None:
            if self.deleted:
                raise outages.StoreUnavailable("the volume went read-only")
            gw.store.delete_image(photo)
            self.deleted += 1

    with pytest.raises(outages.StoreUnavailable):
        prune(gw, Failing())

    assert kept(gw) == {second: True} and first not in kept(gw)
    with gw.engine.connect() as conn:  # the one not deleted is found again, until the next round chooses it again
        assert uploaded.get_image(conn, second, TENANT) is not None
    assert prune(gw) == 1 and kept(gw) == {}


def test_a_tenants_upload_bucket_is_forgotten_once_full_again(gw):
    limits = gw.config.upload_limits()
    b = tables.upload_buckets
    with db.transaction(gw.engine) as conn:
        upload_limits.take(conn, "fresh", limits)
        then = repository.now(conn) - dt.timedelta(seconds=limits.full_after_s() + 60)
        conn.execute(b.insert().values(tenant="idle", tokens=0, at=then))

    with db.transaction(gw.engine) as conn:
        assert upload_limits.forget_buckets(conn, limits.full_after_s(), 10) == 1
        assert set(conn.execute(sa.select(b.c.tenant)).scalars()) == {"fresh"}


def test_a_brand_kits_logo_stays_while_the_kit_shows_it_and_then_while_a_pipeline_made_with_it_does(gw, installation):
    logo = upload(gw, 21, 8 * DAY)
    with db.transaction(gw.engine) as conn:
        brands.save(conn, TENANT, api.BrandKitRequest(logo=str(logo), colors=["#0b3d91"]), None)

    with statements_of(gw.engine) as statements:
        assert prune(gw) == 1  # found named by the kit

    assert kept(gw) == {logo: True}
    assert "brand_kits_logo" in indexes_used(gw.engine, statements)
    with db.transaction(gw.engine) as conn:
        pipeline_id = create(conn)  # its brief's brand shows the logo
        assert brands.delete(conn, TENANT)
        conn.execute(tables.images.update().values(uploaded_at=repository.now(conn) - 8 * DAY))
    with statements_of(gw.engine) as statements:
        assert prune(gw) == 1  # found named by the pipeline

    assert kept(gw) == {logo: True}
    assert "pipelines_brand_logo" in indexes_used(gw.engine, statements)
    pipeline_gone(gw, pipeline_id, logo)
    assert prune(gw) == 1 and kept(gw) == {}
