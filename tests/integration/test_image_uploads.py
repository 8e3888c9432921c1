"""A tenant's photos on the gateway's HTTP API.

Uploaded as bytes or a form, kept once in the artifact store without their metadata, each recorded for its tenant
alone; a bad upload stores nothing; a brief names the tenant's photos by id and its events carry references to
them, never their bytes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import random
import uuid

import pytest
import sqlalchemy as sa
from castad_api import decoding, keys, tables
from castad_contracts import brief, events
from castad_runtime import artifacts, images, links
from castad_runtime import tables as runtime_tables
from PIL import Image
from pydantic import SecretStr

from tests.integration.gateway import make_key
from tests.support.links import LINK_SECRET, stage_link_secret
from tests.unit.test_image_uploads import DAMAGED_EXIF, exif_with_location, multi_picture_jpeg, photo, png_declaring

pytestmark = pytest.mark.integration
BRIEF = {"customer_name": "Stay Meomum", "region": "Gunsan"}
SUBMIT_AND_READ = (keys.Scope.SUBMIT, keys.Scope.READ)


def stored_images(installation) -> list[str]:
    """Every file under the artifact store's images, temporary ones too."""
    root = installation.artifacts_dir / "images"
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()) if root.exists() else []


def image_rows(engine) -> list[sa.Row]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(tables.images)))


def upload(client, data: bytes, media_type: str = "image/jpeg"):
    return client.post("/v1/images", content=data, headers={"Content-Type": media_type})


def submit(client, **fields):
    return client.post("/v1/pipelines", json={**BRIEF, **fields}, headers={"Idempotency-Key": str(uuid.uuid4())})


def test_an_uploaded_photo_is_kept_once_upright_and_without_its_metadata_for_its_tenant(engines, api, installation):
    client = api().client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    sideways = photo("JPEG", (64, 32), exif=exif_with_location(orientation=6), comment=b"taken at home")

    answer = upload(client, sideways)
    again = upload(client, sideways)

    assert answer.status_code == 201, answer.text
    image = answer.json()
    assert again.json() == image  # the same bytes again: the same image
    assert (image["media_type"], image["width"], image["height"]) == ("image/jpeg", 32, 64)
    [kept] = stored_images(installation)
    data = (installation.artifacts_dir / "images" / kept).read_bytes()
    assert kept.endswith(f"/{image['sha256']}.jpg") and hashlib.sha256(data).hexdigest() == image["sha256"]
    assert len(data) == image["size"] and b"PhoneMaker" not in data and b"taken at home" not in data
    with Image.open(io.BytesIO(data)) as read:
        assert read.size == (32, 64) and not read.getexif()
    [row] = image_rows(engines["api"])
    assert (str(row.id), row.tenant, row.sha256) == (image["id"], "hana", image["sha256"])
    assert client.get(f"/v1/images/{image['id']}").json() == image
    content = client.get(f"/v1/images/{image['id']}/content")
    assert (content.status_code, content.content, content.headers["content-type"]) == (200, data, "image/jpeg")


@pytest.mark.parametrize(
    "data", [multi_picture_jpeg(), photo("JPEG", (64, 32), exif=DAMAGED_EXIF)], ids=["multi-picture", "damaged-exif"]
)
def test_a_phones_multi_picture_jpeg_or_one_with_damaged_exif_is_kept_as_a_jpeg(engines, api, data):
    client = api().client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))

    answer = upload(client, data)

    assert answer.status_code == 201, answer.text
    assert answer.json()["media_type"] == "image/jpeg"


def test_a_photo_may_come_as_the_file_field_of_a_multipart_form(engines, api):
    client = api().client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))

    answer = client.post("/v1/images", files={"file": ("garden.png", photo("PNG"), "application/octet-stream")})

    assert answer.status_code == 201, answer.text
    assert (answer.json()["media_type"], answer.json()["width"]) == ("image/png", 64)
    refused = client.post("/v1/images", files={"picture": ("garden.png", photo("PNG"), "image/png")})
    assert refused.status_code in (400, 422)  # a form whose file is not `file`


@pytest.mark.parametrize(
    ("data", "media_type", "status", "field", "reason"),
    [
        (b"%PDF-1.7 a document", "image/jpeg", 422, ["body"], "is not a JPEG, PNG or WebP image"),
        (photo("JPEG")[:-200], "image/jpeg", 422, ["body"], "truncated or corrupt"),
        (png_declaring(20_000, 20_000), "image/png", 422, ["body"], "pixels accepted"),
        (photo("PNG"), "image/webp", 422, ["body"], "is a image/png image, not the image/webp it was sent as"),
        (photo("GIF"), "image/gif", 415, None, "Content-Type must be image/jpeg, image/png, image/webp"),
        (b"\xff\xd8" + b"\x00" * 30_000_000, "image/jpeg", 413, None, "request body larger than"),
    ],
    ids=["not-an-image", "truncated", "bomb", "mislabelled", "wrong-type", "30-mb"],
)
def test_a_bad_upload_is_refused_naming_the_field_and_the_reason_and_nothing_is_stored(
    engines, api, installation, data, media_type, status, field, reason
):
    client = api().client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))

    answer = upload(client, data, media_type)

    assert answer.status_code == status, answer.text
    detail = answer.json()["detail"]
    if field is None:
        assert reason in detail
    else:
        assert detail[0]["loc"] == field and reason in detail[0]["msg"]
    assert stored_images(installation) == [] and image_rows(engines["api"]) == []


def test_an_upload_past_those_waiting_for_their_decode_is_refused_with_503_and_nothing_is_stored(
    engines, api, installation
):
    running = api()
    client = running.client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))

    with contextlib.ExitStack() as taken:
        for _ in range(decoding.AT_ONCE + decoding.WAITING):  # decoding one, the others waiting their turn
            taken.enter_context(running.gateway.decoding.admitted())
        refused = upload(client, photo())

    assert (refused.status_code, refused.headers["Retry-After"]) == (503, str(decoding.RETRY_AFTER_S))
    assert "try again shortly" in refused.json()["detail"]
    assert stored_images(installation) == [] and image_rows(engines["api"]) == []
    assert upload(client, photo()).status_code == 201  # once their turns are over


def test_an_upload_the_volume_refuses_is_a_503_and_nothing_is_recorded(engines, api, installation, monkeypatch):
    client = api().client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    refused = upload(client, photo())

    assert (refused.status_code, "Retry-After" in refused.headers) == (503, True)
    assert stored_images(installation) == [] and image_rows(engines["api"]) == []


def test_an_upload_needs_a_key_that_may_submit(engines, api, installation):
    running = api()
    reader = running.client(make_key(engines["api"], "hana", keys.Scope.READ))

    assert (
        running.client(None).post("/v1/images", content=photo(), headers={"Content-Type": "image/jpeg"}).status_code
        == 401
    )
    assert upload(reader, photo()).status_code == 403
    assert stored_images(installation) == []


def test_a_brief_names_its_tenants_photos_and_its_event_carries_references_not_bytes(engines, api):
    client = api().client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    first = upload(client, photo("JPEG", (64, 32))).json()
    second = upload(client, photo("WEBP", (40, 40)), "image/webp").json()

    answer = submit(client, photos=[second["id"], first["id"]])

    assert answer.status_code == 202, answer.text
    owner = artifacts.image_owner("hana")
    references = [
        {"id": image["id"], "owner": owner, **{key: image[key] for key in ("sha256", "media_type", "size")}}
        for image in (second, first)
    ]
    assert client.get(f"/v1/pipelines/{answer.json()['id']}").json()["brief"]["photos"] == references
    with engines["api"].connect() as conn:
        [envelope] = conn.execute(
            sa.select(runtime_tables.outbox.c.envelope).where(
                runtime_tables.outbox.c.pipeline_id == answer.json()["id"]
            )
        ).scalars()
    # The newest version, which tells the tenant's share for the stages' fair turns; without it, uploads only are the
    # version that first carried uploaded photos, which a stage of that release reads.
    assert (envelope["type"], envelope["schemaversion"]) == ("pipeline.requested", 8)
    requested = events.REGISTRY.read("pipeline.requested", 8, envelope["data"])
    unshared = requested.model_copy(update={"share": None})
    assert events.REGISTRY.oldest_carrying("pipeline.requested", unshared)[0] == 3
    assert envelope["data"]["brief"]["photos"] == references
    assert len(str(envelope)) < 2_000  # references only: no image's bytes


def test_a_brief_may_name_a_photo_by_an_https_url_of_a_public_host_which_the_stages_get_as_it_is(engines, api):
    key = make_key(engines["api"], "hana", *SUBMIT_AND_READ)
    client = api().client(key)
    uploaded = upload(client, photo()).json()

    for url in (
        "http://photos.example.com/hall.jpg",
        "https://127.0.0.1/hall.jpg",
        "https://169.254.169.254/latest/meta-data/",
        "https://localhost:8443/hall.jpg",
    ):
        refused = submit(client, photos=[uploaded["id"], url])
        assert refused.status_code == 422, url
        [error] = refused.json()["detail"]
        assert error["loc"] == ["body", "photos", 1] and "must be an https URL of a public address" in error["msg"]
    answer = submit(client, photos=[uploaded["id"], "https://photos.example.com/hall.jpg"])

    assert answer.status_code == 202, answer.text
    named = client.get(f"/v1/pipelines/{answer.json()['id']}").json()["brief"]["photos"]
    assert [photo.get("id") for photo in named] == [uploaded["id"], None]
    assert named[1] == {"url": "https://photos.example.com/hall.jpg"}
    # A local set-up's test photo host, on this machine over plain http: only where the gateway allows it.
    lenient = api(photo_allow_private=True).client(key)
    assert submit(lenient, photos=["http://127.0.0.1:8080/hall.jpg"]).status_code == 202


def test_another_tenants_image_is_not_found_on_any_route_and_a_brief_cannot_name_it(engines, api, installation):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    mina = running.client(make_key(engines["api"], "mina", *SUBMIT_AND_READ))
    hanas = upload(hana, photo()).json()

    for path in (f"/v1/images/{hanas['id']}", f"/v1/images/{hanas['id']}/content"):
        assert mina.get(path).status_code == 404 and hana.get(path).status_code == 200
        assert mina.get(path.replace(hanas["id"], str(uuid.uuid4()))).status_code == 404
    refused = submit(mina, photos=[hanas["id"]])
    assert refused.status_code == 422
    [error] = refused.json()["detail"]
    assert (
        error["loc"] == ["body", "photos", 0] and f"no image {hanas['id']} was uploaded by this tenant" in error["msg"]
    )
    # The same bytes uploaded by another tenant are its own image, kept in its own place.
    minas = upload(mina, photo()).json()
    assert minas["id"] != hanas["id"] and minas["sha256"] == hanas["sha256"] and len(stored_images(installation)) == 2
    assert submit(mina, photos=[minas["id"]]).status_code == 202


@pytest.mark.parametrize(
    ("count", "repeat", "reason"),
    [(21, False, "at most 20 items"), (2, True, "names the same photo more than once")],
)
def test_a_brief_names_at_most_20_photos_each_once(engines, api, count, repeat, reason):
    client = api().client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    ids = [str(uuid.uuid4()) for _ in range(count)]
    if repeat:
        ids[1] = ids[0]

    answer = submit(client, photos=ids)

    assert answer.status_code == 422
    [error] = answer.json()["detail"]
    assert error["loc"] == ["body", "photos"] and reason in error["msg"]


def test_a_link_the_video_stage_signed_opens_one_photo_of_its_pipelines_brief_and_nothing_else(engines, api):
    running = api(link_secret=SecretStr(LINK_SECRET))
    hana = running.client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    mina = running.client(make_key(engines["api"], "mina", *SUBMIT_AND_READ))
    named, unnamed = upload(hana, photo("JPEG", (64, 32))).json(), upload(hana, photo("PNG"), "image/png").json()
    minas = upload(mina, photo("WEBP", (40, 40)), "image/webp").json()
    pipeline = submit(hana, photos=[named["id"]]).json()["id"]
    anonymous = running.client(None)
    video = stage_link_secret("video")

    def fetched(path: str, key=video, purpose=links.Purpose.PHOTO):
        return anonymous.get(links.sign(running.base_url, path, key, purpose, 3600))

    opened = fetched(f"/v1/links/pipelines/{pipeline}/photos/{named['id']}")
    assert opened.status_code == 200 and hashlib.sha256(opened.content).hexdigest() == named["sha256"]
    assert opened.headers["content-type"] == "image/jpeg"
    # The tenant's image the brief does not name, another tenant's, and one of another pipeline: not found.
    for image in (unnamed, minas):
        assert fetched(f"/v1/links/pipelines/{pipeline}/photos/{image['id']}").status_code == 404
    assert fetched(f"/v1/links/pipelines/{uuid.uuid4()}/photos/{named['id']}").status_code == 404
    # Signed by the song stage, or for the song's file: refused.
    assert fetched(f"/v1/links/pipelines/{pipeline}/photos/{named['id']}", stage_link_secret("song")).status_code == 401
    artifact = links.Purpose.ARTIFACT
    assert fetched(f"/v1/links/pipelines/{pipeline}/photos/{named['id']}", purpose=artifact).status_code == 401


def test_each_upload_a_brief_names_is_sealed_for_its_pipeline_in_the_event_and_only_there(engines, api):
    """pipeline.requested carries each upload with the gateway's seal for that pipeline, under the video stage's key.

    The pipeline as its tenant reads it shows the brief as sent; without a link secret nothing is sealed.
    """
    sealing = api(link_secret=SecretStr(LINK_SECRET)).client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    image = upload(sealing, photo("JPEG", (64, 32))).json()
    pipeline = submit(sealing, photos=[image["id"], "https://example.com/a.jpg"]).json()["id"]
    plain = api().client(make_key(engines["api"], "mina", *SUBMIT_AND_READ))
    unsealed = submit(plain, photos=[upload(plain, photo("PNG"), "image/png").json()["id"]]).json()["id"]

    with engines["api"].connect() as conn:
        told = dict(
            conn.execute(
                sa.select(runtime_tables.outbox.c.pipeline_id, runtime_tables.outbox.c.envelope).where(
                    runtime_tables.outbox.c.routing_key == "pipeline.requested"
                )
            ).all()
        )
    requested = events.PipelineRequested.model_validate(told[pipeline]["data"])
    [upload_, link] = requested.brief.photos
    assert isinstance(upload_, brief.Photo) and isinstance(link, brief.PhotoLink)
    assert upload_.seal == links.photo_seal(stage_link_secret("video"), pipeline, upload_)
    assert link.seal == links.photo_seal(stage_link_secret("video"), pipeline, link)
    assert told[pipeline]["schemaversion"] == 8  # it tells the tenant's share (pipeline.requested v8)
    unshared = [
        events.REGISTRY.oldest_carrying("pipeline.requested", made.model_copy(update={"share": None}))[0]
        for made in (requested, events.REGISTRY.read("pipeline.requested", 8, told[unsealed]["data"]))
    ]
    assert unshared[0] == 5  # without the share, the version that first carried seals (a brief without formats)
    assert "seal" not in told[unsealed]["data"]["brief"]["photos"][0]  # read by a release before seals too
    assert unshared[1] < unshared[0]
    shown = sealing.get(f"/v1/pipelines/{pipeline}").json()["brief"]["photos"]
    assert shown[0] == upload_.model_copy(update={"seal": None}).model_dump(mode="json")  # as the tenant sent it


def test_a_tenant_uploading_faster_than_it_may_is_refused_with_429_before_its_upload_is_decoded(
    engines, api, installation, monkeypatch
):
    running = api(image_upload_burst=2, image_uploads_per_minute=1)
    hana = running.client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    hanas_other_key = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT))
    mina = running.client(make_key(engines["api"], "mina", *SUBMIT_AND_READ))
    answers = [upload(hana, b"not an image"), upload(hana, photo())]
    decode = images.clean

    def no_decode(*args: object, **kwargs: object) -> images.Cleaned:
        raise AssertionError("an upload over the tenant's rate was decoded")

    monkeypatch.setattr(images, "clean", no_decode)
    answers.append(upload(hanas_other_key, photo("PNG"), "image/png"))  # the tenant's bucket, whichever its key
    monkeypatch.setattr(images, "clean", decode)

    assert [answer.status_code for answer in answers] == [422, 201, 429]  # a refused upload counts too
    refused = answers[-1]
    assert 55 <= int(refused.headers["Retry-After"]) <= 60  # a token a minute
    assert "may upload 2 images at once, then 1 a minute" in refused.json()["detail"]
    assert len(stored_images(installation)) == 1 and len(image_rows(engines["api"])) == 1
    assert upload(mina, photo("PNG"), "image/png").status_code == 201  # another tenant's bucket is its own


@pytest.mark.parametrize(
    ("limit", "reason"),
    [
        ({"image_max_per_tenant": 1}, "holds 1 images, as many as it may"),
        ({"image_max_bytes": 1024, "image_max_bytes_per_tenant": 1024}, "bytes of images and this one is"),
    ],
    ids=["images", "bytes"],
)
def test_an_upload_past_what_a_tenant_may_hold_is_a_409_and_nothing_is_stored(
    engines, api, installation, limit, reason
):
    running = api(**limit)
    hana = running.client(make_key(engines["api"], "hana", *SUBMIT_AND_READ))
    first = noise()
    kept = upload(hana, first, "image/png")
    assert kept.status_code == 201, kept.text

    again, other = upload(hana, first, "image/png"), upload(hana, photo("JPEG", (30, 30)))

    assert again.status_code == 201 and again.json() == kept.json()  # the image it holds: nothing more held
    assert other.status_code == 409 and reason in other.json()["detail"]
    assert len(stored_images(installation)) == 1 and len(image_rows(engines["api"])) == 1


def noise() -> bytes:
    """A PNG of 16 x 16 random pixels: some 850 bytes, which no encoding makes much smaller."""
    pixels = random.Random(0).randbytes(16 * 16 * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (16, 16), pixels).save(out, "PNG")
    return out.getvalue()
