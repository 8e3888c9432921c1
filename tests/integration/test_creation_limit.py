"""A key's creation limit on the gateway's HTTP API: a refused creation leaves nothing behind."""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa
from castad_api import creation, keys, tables
from castad_runtime import tables as runtime_tables

from tests.integration.gateway import make_key

pytestmark = pytest.mark.integration
BRIEF = {"customer_name": "Cafe Blue", "region": "Busan"}


def test_a_creation_over_the_keys_limit_is_refused_and_leaves_no_pipeline_and_no_event(engines, api):
    engine = engines["api"]
    client = api(creations_per_minute=2).client(make_key(engine, "erin", keys.Scope.SUBMIT))
    outbox, timeline = runtime_tables.outbox, tables.timeline
    with engine.connect() as conn:
        before = [conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one() for t in (outbox, timeline)]

    answers = [
        client.post("/v1/pipelines", json=BRIEF, headers={"Idempotency-Key": str(uuid.uuid4())}) for _ in range(6)
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


def test_a_key_whose_minute_is_used_up_is_refused_before_any_work(engines, api, monkeypatch):
    engine = engines["api"]
    key = make_key(engine, "fay", keys.Scope.SUBMIT)
    client = api(creations_per_minute=3).client(key)
    minute = sa.func.date_trunc("minute", sa.func.now())
    left_s = 60 - time.time() % 60
    if left_s < 5:  # the count below and the POST must fall in one minute
        time.sleep(left_s + 0.1)
    with engine.begin() as conn:  # three creations this minute already, as other requests or replicas made them
        key_id = conn.execute(sa.select(tables.api_keys.c.id).where(tables.api_keys.c.digest == keys.digest(key)))
        conn.execute(tables.key_windows.insert().values(key_id=key_id.scalar_one(), window_start=minute, count=3))

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("a creation over the limit got as far as creating")

    monkeypatch.setattr(creation, "create", no_work)
    answer = client.post("/v1/pipelines", json=BRIEF, headers={"Idempotency-Key": str(uuid.uuid4())})

    assert answer.status_code == 429, answer.text
    assert "3 pipelines a minute" in answer.json()["detail"]
    assert 1 <= int(answer.headers["retry-after"]) <= 60
