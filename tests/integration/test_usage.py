"""Metering and budgets on the gateway (usage.py): what each tenant used, counted once from the stages' events and
its creations, read back by GET /v1/usage; a brief past a budget refused with the limit and when it resets; a
tenant's weight told to the stages with its pipelines."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import uuid

import pytest
import sqlalchemy as sa
from castad_api import keys, usage
from castad_contracts import envelope, events
from castad_runtime import db
from castad_runtime import tables as runtime_tables
from castad_testkit import briefs

from tests.integration.gateway import LYRICS, MEDIA, make_key
from tests.integration.helpers import now

pytestmark = pytest.mark.integration
KEYS = {name: str(uuid.uuid4()) for name in ("one", "two", "three", "a", "w")}
BRIEF = {"customer_name": "Cafe Blue", "region": "Busan"}
PRICES = {"song_calls": 0.5, "song_seconds": 0.01, "video_seconds": 0.02}


def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def artifact(stage: events.Stage, size: int) -> events.Artifact:
    return events.Artifact(uri=f"file:///a/{stage.value}", sha256="0" * 64, size=size, media_type=MEDIA[stage])


def ended(pipeline_id: str, stage: events.Stage, fact: str, calls: int | None, **more: object) -> envelope.Envelope:
    """The event ending an attempt of `stage` that sent its provider `calls` requests for work."""
    common = {"pipeline_id": pipeline_id, "stage": stage, "job_id": "j", "attempt": 1, "provider_calls": calls}
    payload: events.Payload
    if fact == "retrying":
        payload = events.StageRetrying(
            **common, max_attempts=3, error_code="provider_error", error_message="m", next_attempt_at=now()
        )
    else:
        fields = {**common, "completed_at": now(), "brief": briefs.sample("Cafe Blue", region="Busan"), **more}
        if stage is events.Stage.SONG:
            payload = events.SongCompleted(**fields, lyrics=LYRICS, timed_lines=())
        else:
            payload = events.VideoCompleted(**fields)
    return envelope.wrap(payload, events.stage_event(stage, fact), f"/castad/{stage.value}")


def test_usage_is_what_the_stages_events_say_counted_once_per_tenant_and_priced(engines, gateway, api):
    engine = engines["api"]
    mine, theirs = tenant(), tenant()
    first, second = gateway.create(tenant=mine), gateway.create(tenant=mine)
    other = gateway.create(tenant=theirs)
    song = ended(
        first, events.Stage.SONG, "completed", 1, artifact=artifact(events.Stage.SONG, 1000), song_duration_s=30.0
    )
    retried = ended(second, events.Stage.SONG, "retrying", 2)
    video = ended(
        first,
        events.Stage.VIDEO,
        "completed",
        None,  # a local renderer: no provider asked
        artifact=artifact(events.Stage.VIDEO, 5000),
        width=144,
        height=256,
        duration_s=30.0,
        poster=artifact(events.Stage.VIDEO, 70),
    )
    for env in (song, retried, video, song):  # the song's event twice: counted once
        gateway.deliver(env)
    with gateway.together():  # a group projected in one transaction counts as each alone does
        gateway.deliver(ended(other, events.Stage.SONG, "retrying", 1))
        gateway.deliver(ended(other, events.Stage.SONG, "retrying", 1).model_copy(update={"id": uuid.uuid4()}))

    admin = api(prices=PRICES).client(make_key(engine, "ops", keys.Scope.ADMIN))
    client = api(prices=PRICES).client(make_key(engine, mine, keys.Scope.READ))
    read = client.get("/v1/usage").json()

    assert read["tenant"] == mine and read["currency"] == "USD" and read["weight"] == 1
    total = read["total"]
    assert (total["song_calls"], total["song_seconds"], total["video_seconds"]) == (3, 30.0, 30.0)
    assert total["stored_bytes"] == 1000 + 5000 + 70 and total["video_calls"] == 0
    assert total["estimated_cost"] == pytest.approx(3 * 0.5 + 30 * 0.01 + 30 * 0.02)
    assert [day["tenant"] for day in read["days"]] == [mine]
    theirs_read = admin.get("/v1/usage", params={"tenant": theirs}).json()
    assert theirs_read["total"]["song_calls"] == 2
    everyone = admin.get("/v1/usage").json()
    assert {day["tenant"] for day in everyone["days"]} >= {mine, theirs} and everyone["tenant"] is None


def test_a_key_reads_its_own_tenants_usage_only_and_a_bad_span_names_its_field(engines, api):
    engine = engines["api"]
    client = api().client(make_key(engine, tenant(), keys.Scope.READ))

    assert client.get("/v1/usage", params={"tenant": "someone-else"}).status_code == 403
    refused = client.get("/v1/usage", params={"from": "2026-12-05", "to": "2026-12-01"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "from"]
    too_long = client.get("/v1/usage", params={"from": "2024-01-01", "to": "2026-01-01"})
    assert too_long.status_code == 422 and too_long.json()["detail"][0]["loc"] == ["query", "to"]
    assert client.get("/v1/usage", params={"from": "yesterday"}).status_code == 422
    admin = api().client(make_key(engine, "ops", keys.Scope.ADMIN))
    for bad in ("", "\x00", "a\nb"):
        refused = admin.get("/v1/usage", params={"tenant": bad})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "tenant"], bad


def test_a_brief_past_the_days_pipelines_is_refused_with_the_limit_and_when_it_resets(engines, api):
    engine = engines["api"]
    who = tenant()
    with db.transaction(engine) as conn:
        usage.set_budget(conn, who, usage.Limits("day", 2, None, None))
    client = api().client(make_key(engine, who, keys.Scope.SUBMIT, keys.Scope.READ))
    posted = [
        client.post("/v1/pipelines", json=BRIEF, headers={"Idempotency-Key": key})
        for key in (KEYS["one"], KEYS["two"], KEYS["three"])
    ]

    assert [answer.status_code for answer in posted] == [202, 202, 429]
    refused = posted[2].json()
    tomorrow = dt.datetime.combine(now().date() + dt.timedelta(days=1), dt.time(), dt.UTC)
    assert refused["detail"] == f"{who}'s daily budget of 2 pipelines is reached; it resets at {tomorrow.isoformat()}"
    assert dt.datetime.fromisoformat(refused["resets_at"]) == tomorrow
    assert 1 <= int(posted[2].headers["retry-after"]) <= 86400
    replay = client.post("/v1/pipelines", json=BRIEF, headers={"Idempotency-Key": KEYS["one"]})
    assert replay.status_code == 202 and replay.json()["id"] == posted[0].json()["id"]  # a replay makes nothing
    budget = client.get("/v1/usage").json()["budgets"]
    assert [(b["period"], b["pipelines"], b["used"]["pipelines"]) for b in budget] == [("day", 2, 2)]
    with engine.connect() as conn:  # the refused one left nothing
        made = conn.execute(sa.text("SELECT count(*) FROM pipelines WHERE tenant = :t"), {"t": who}).scalar_one()
    assert made == 2


def test_a_brief_past_the_months_estimated_cost_is_refused_402_and_a_raised_budget_lets_the_next_in(
    engines, gateway, api
):
    engine = engines["api"]
    who = tenant()
    with db.transaction(engine) as conn:
        usage.set_budget(conn, who, usage.Limits("month", None, None, 1.0))
    client = api(prices=PRICES).client(make_key(engine, who, keys.Scope.SUBMIT))
    made = gateway.create(tenant=who)
    gateway.deliver(ended(made, events.Stage.SONG, "retrying", 2))  # 2 calls at 0.5: the budget is reached

    refused = client.post("/v1/pipelines", json=BRIEF, headers={"Idempotency-Key": KEYS["a"]})
    assert refused.status_code == 402
    assert refused.json()["detail"].startswith(f"{who}'s monthly budget of 1 in estimated cost is reached (1.00 used)")
    with db.transaction(engine) as conn:
        usage.set_budget(conn, who, usage.Limits("month", None, None, 5.0))
    again = client.post("/v1/pipelines", json=BRIEF, headers={"Idempotency-Key": KEYS["a"]})
    assert again.status_code == 202


def test_a_pipeline_tells_the_stages_its_tenant_and_weight(engines, api):
    engine = engines["api"]
    who = tenant()
    with db.transaction(engine) as conn:
        usage.set_weight(conn, who, 3)
    client = api().client(make_key(engine, who, keys.Scope.SUBMIT))

    made = client.post("/v1/pipelines", json=BRIEF, headers={"Idempotency-Key": KEYS["w"]})

    outbox = runtime_tables.outbox
    with engine.connect() as conn:
        row = conn.execute(sa.select(outbox).where(outbox.c.pipeline_id == made.json()["id"])).one()
    requested = envelope.Envelope.model_validate(row.envelope).payload()
    assert isinstance(requested, events.PipelineRequested) and requested.share == events.Share(tenant=who, weight=3)


def test_concurrent_briefs_of_a_tenant_with_a_budget_are_counted_one_after_the_other(engines, api):
    engine = engines["api"]
    who = tenant()
    with db.transaction(engine) as conn:
        usage.set_budget(conn, who, usage.Limits("month", 3, None, None))
    key = make_key(engine, who, keys.Scope.SUBMIT)
    running = [api(), api()]  # two gateway replicas (each a process of its own in a deployment)
    clients = [running[n % 2].client(key) for n in range(8)]
    for client in clients[:2]:  # each app builds its routes once, at its first request (FastAPI): not two at once here
        assert client.get("/v1/me").status_code == 200

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda client: client.post("/v1/pipelines", json=BRIEF, headers={"Idempotency-Key": str(uuid.uuid4())}),
                clients,
            )
        )

    assert sorted(answer.status_code for answer in answers) == [202] * 3 + [429] * 5
    with engine.connect() as conn:
        made = conn.execute(sa.text("SELECT count(*) FROM pipelines WHERE tenant = :t"), {"t": who}).scalar_one()
        counted = conn.execute(
            sa.text("SELECT sum(amount) FROM usage WHERE tenant = :t AND meter = 'pipelines'"), {"t": who}
        ).scalar_one()
    assert made == counted == 3


def test_a_cost_budget_takes_the_pipelines_own_price_up_to_the_limit_and_not_past_it(engines, api):
    engine = engines["api"]
    who = tenant()
    with db.transaction(engine) as conn:
        usage.set_budget(conn, who, usage.Limits("day", None, None, 1.0))
    client = api(prices={"pipelines": 0.5}).client(make_key(engine, who, keys.Scope.SUBMIT))

    statuses = [
        client.post("/v1/pipelines", json=BRIEF, headers={"Idempotency-Key": str(uuid.uuid4())}).status_code
        for _ in range(3)
    ]

    assert statuses == [202, 202, 402]  # 0.5 and 1.0 are within a budget of 1.0; a third would make 1.5
