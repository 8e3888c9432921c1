"""A tenant's brand kit on the gateway: set, read and removed through /v1/brand, and used by the pipelines made after.

Its logo is an image of the tenant's; a pipeline records the kit it began with in its brief (pipeline.requested
carries it to the stages, its logo sealed for the pipeline as a photo is), so a kit changed since changes no
pipeline; a brief may ask for none.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from castad_api import keys
from castad_contracts import brief, events
from castad_runtime import links
from castad_runtime import tables as runtime_tables
from pydantic import SecretStr

from tests.integration.gateway import make_key
from tests.support.links import LINK_SECRET, stage_link_secret
from tests.unit.test_image_uploads import photo

pytestmark = pytest.mark.integration

KIT = {"colors": ["#0B3D91", "#ffc20e"], "font": "Nanum Myeongjo", "caption_style": {"position": "bottom"}}


def logo_of(client) -> str:
    uploaded = client.post("/v1/images", content=photo("PNG", (48, 48)), headers={"Content-Type": "image/png"})
    assert uploaded.status_code == 201, uploaded.text
    return uploaded.json()["id"]


def submit(client, key: str, **fields) -> str:
    body = {"customer_name": "Cafe Blue", "region": "Busan", **fields}
    accepted = client.post("/v1/pipelines", json=body, headers={"Idempotency-Key": key})
    assert accepted.status_code == 202, accepted.text
    return accepted.json()["id"]


def requested(engine: sa.Engine, pipeline_id: str) -> events.PipelineRequested:
    """The pipeline.requested event its outbox holds, as the lyric stage reads it."""
    outbox = runtime_tables.outbox
    with engine.connect() as conn:
        told = conn.execute(
            sa.select(outbox.c.envelope).where(
                outbox.c.pipeline_id == pipeline_id, outbox.c.routing_key == events.PIPELINE_REQUESTED
            )
        ).scalar_one()
    return events.REGISTRY.read(events.PIPELINE_REQUESTED, told["schemaversion"], told["data"])


def test_a_kit_is_set_read_and_used_by_the_pipelines_made_after_it_each_keeping_the_one_it_began_with(engines, api):
    running = api(link_secret=SecretStr(LINK_SECRET))
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    before = hana.get("/v1/brand")
    assert before.status_code == 404 and "no brand kit" in before.json()["detail"]
    plain = submit(hana, "before")
    logo = logo_of(hana)

    put = hana.put("/v1/brand", json={**KIT, "logo": logo})

    assert put.status_code == 200, put.text
    kit = put.json()
    assert {key: kit[key] for key in ("logo", "logo_download", "colors", "font", "caption_style")} == {
        "logo": logo,
        "logo_download": f"/v1/images/{logo}/content",
        "colors": ["#0b3d91", "#ffc20e"],
        "font": "Nanum Myeongjo",
        "caption_style": {"position": "bottom", "size": "medium"},
    }
    assert hana.get("/v1/brand").json() == kit
    branded = submit(hana, "after")
    shown = hana.get(f"/v1/pipelines/{branded}").json()["brief"]["brand"]
    assert (shown["colors"], shown["logo"]["id"], shown["logo"].get("seal")) == (["#0b3d91", "#ffc20e"], logo, None)
    assert "brand" not in hana.get(f"/v1/pipelines/{plain}").json()["brief"]  # made before the kit
    # To the stages, its logo sealed for the pipeline under the video stage's key.
    told = requested(engines["api"], branded).brief.brand
    assert told is not None and told.logo is not None and told.font == brief.FontFamily.NANUM_MYEONGJO
    assert links.seal_holds(stage_link_secret("video"), branded, told.logo)

    # A kit changed since changes no pipeline made before; a brief may ask for none.
    assert hana.put("/v1/brand", json={"colors": ["#222222"]}).status_code == 200
    assert hana.get(f"/v1/pipelines/{branded}").json()["brief"]["brand"]["colors"] == ["#0b3d91", "#ffc20e"]
    assert hana.get(f"/v1/pipelines/{submit(hana, 'changed')}").json()["brief"]["brand"]["colors"] == ["#222222"]
    assert "brand" not in hana.get(f"/v1/pipelines/{submit(hana, 'none', brand='none')}").json()["brief"]
    assert hana.delete("/v1/brand").status_code == 204
    assert hana.get("/v1/brand").status_code == 404 and hana.delete("/v1/brand").status_code == 404
    assert "brand" not in hana.get(f"/v1/pipelines/{submit(hana, 'removed')}").json()["brief"]


@pytest.mark.parametrize(
    ("body", "field", "said"),
    [
        ({"colors": ["#fff"]}, "colors.0", "String should match pattern"),
        ({"colors": []}, "colors", "at least 1 item"),
        ({"colors": ["#000000"], "font": "Comic Sans"}, "font", "Input should be"),
        ({"colors": ["#000000"], "caption_style": {"size": "huge"}}, "caption_style.size", "Input should be"),
        ({"colors": ["#000000"], "motto": "fresh"}, "motto", "Extra inputs are not permitted"),
        ({"colors": ["#000000"], "logo": "not-an-id"}, "logo", "String should match pattern"),
    ],
)
def test_a_kit_that_is_not_one_is_refused_naming_the_field(engines, api, body, field, said):
    hana = api().client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))

    refused = hana.put("/v1/brand", json=body)

    assert refused.status_code == 422, refused.text
    assert any(
        ".".join(map(str, problem["loc"])) == f"body.{field}" and said in problem["msg"]
        for problem in refused.json()["detail"]
    ), refused.json()


def test_a_logo_must_be_the_tenants_own_upload_and_a_reader_cannot_set_a_kit(engines, api):
    running = api()
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    mina = running.client(make_key(engines["api"], "mina", keys.Scope.SUBMIT, keys.Scope.READ))
    reader = running.client(make_key(engines["api"], "hana", keys.Scope.READ))
    minas = logo_of(mina)

    refused = hana.put("/v1/brand", json={"colors": ["#000000"], "logo": minas})

    assert refused.status_code == 422
    [problem] = refused.json()["detail"]
    assert (problem["loc"], problem["msg"]) == (["body", "logo"], f"no image {minas} was uploaded by this tenant")
    assert reader.put("/v1/brand", json={"colors": ["#000000"]}).status_code == 403
    assert hana.get("/v1/brand").status_code == 404  # nothing was set
    assert mina.put("/v1/brand", json={"colors": ["#000000"], "logo": minas}).status_code == 200
    assert hana.get("/v1/brand").status_code == 404  # another tenant's kit is not hana's


def test_a_link_the_video_stage_signed_opens_the_logo_of_its_pipelines_brand_and_not_the_kits_next_one(engines, api):
    """How a render API fetches the logo: the one the pipeline began with, not one its kit shows since."""
    running = api(link_secret=SecretStr(LINK_SECRET))
    hana = running.client(make_key(engines["api"], "hana", keys.Scope.SUBMIT, keys.Scope.READ))
    first, second = (
        logo_of(hana),
        hana.post("/v1/images", content=photo("JPEG", (32, 32)), headers={"Content-Type": "image/jpeg"}).json()["id"],
    )
    assert hana.put("/v1/brand", json={"colors": ["#000000"], "logo": first}).status_code == 200
    pipeline = submit(hana, "branded")
    assert hana.put("/v1/brand", json={"colors": ["#000000"], "logo": second}).status_code == 200
    anonymous = running.client(None)

    def fetched(image: str):
        path = f"/v1/links/pipelines/{pipeline}/photos/{image}"
        return anonymous.get(links.sign(running.base_url, path, stage_link_secret("video"), links.Purpose.PHOTO, 600))

    assert fetched(first).status_code == 200 and fetched(first).headers["content-type"] == "image/png"
    assert fetched(second).status_code == 404
