"""A key's creation limit on the gateway's HTTP API: a refused creation leaves nothing behind."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from castad_api import keys, tables
from castad_runtime import tables as runtime_tables

from tests.integration.gateway import make_key

pytestmark = pytest.mark.integration


def test_a_creation_over_the_keys_limit_is_refused_and_leaves_no_pipeline_and_no_event(engines, api):
    engine = engines["api"]
    client = api(creations_per_minute=2).client(make_key(engine, "erin", keys.Scope.SUBMIT))
    brief = {"customer_name": "Cafe Blue", "region": "Busan"}
    outbox, timeline = runtime_tables.outbox, tables.timeline
    with engine.connect() as conn:
        before = [conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one() for t in (outbox, timeline)]

    answers = [
        client.post("/v1/pipelines", json=brief, headers={"Idempotency-Key": str(uuid.uuid4())}) for _ in range(6)
    ]

    statuses = [answer.status_code for answer in answers]
    assert set(statuses) == {202, 429} and statuses.count(202) <= 4, statuses  # 2 a minute; a minute may turn
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "2 pipelines a minute" in refused.json()["detail"]
    accepted = {answer.json()["id"] for answer in answers if answer.status_code == 202}
    with engine.connect() as conn:
        pipelines = set(conn.execute(sa.select(tables.pipelines.c.id).where(tables.pipelines.c.tenant == "erin")))
        after = [conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one() for t in (outbox, timeline)]
    assert {str(row.id) for row in pipelines} == accepted
    assert [n - m for n, m in zip(after, before, strict=True)] == [len(accepted), len(accepted)]  # nothing else
