"""A provider's callback link, sent again and again while it is valid, brings a stage's poll forward a bounded
number of times: CASTAD_API_CALLBACK_BURST at once, CASTAD_API_CALLBACKS_PER_S after, per pipeline and stage."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from castad_contracts import events
from castad_runtime import links, tables
from pydantic import SecretStr

from tests.support import links as test_links

pytestmark = pytest.mark.integration


def callback(base_url: str, stage: events.Stage, pipeline_id: str) -> str:
    path = f"/v1/provider-callbacks/{stage.value}/{pipeline_id}"
    return links.sign(base_url, path, test_links.stage_link_secret(stage), links.Purpose.CALLBACK, 3600)


def notes(engine: sa.Engine, stage: events.Stage) -> int:
    with engine.connect() as conn:
        query = sa.select(sa.func.count()).where(tables.outbox.c.routing_key == events.provider_called_back(stage))
        return conn.execute(query).scalar_one()


def test_a_callback_link_replayed_is_taken_up_to_its_burst_then_answered_429_and_other_stages_are_not_held(
    api, gateway, engines
):
    running = api(link_secret=SecretStr(test_links.LINK_SECRET), callback_burst=2, callbacks_per_s=0.01)
    pipeline_id = gateway.create()
    anyone = running.client(None)
    song = callback(running.base_url, events.Stage.SONG, pipeline_id)

    answers = [anyone.post(song) for _ in range(4)]
    video = anyone.post(callback(running.base_url, events.Stage.VIDEO, pipeline_id))

    assert [answer.status_code for answer in answers] == [204, 204, 429, 429]
    assert 1 <= int(answers[2].headers["retry-after"]) <= 200
    assert video.status_code == 204  # another stage of the pipeline has a bucket of its own
    assert (notes(engines["api"], events.Stage.SONG), notes(engines["api"], events.Stage.VIDEO)) == (2, 1)
