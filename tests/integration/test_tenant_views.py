"""What a tenant's key is shown of the gateway's internals, through its HTTP API.

No worker host names (an opaque id per pipeline instead), no internal error texts (each code's public message), no
dead letters' reasons, and cursors that number a pipeline's own entries or say nothing at all, so that no number
tells the platform's volume. An operator (an admin key) still sees everything. Every operator action records the
acting key's id and name besides the X-Castad-Actor it gave.
"""

from __future__ import annotations

import json
import re
import threading
import uuid

import httpx
import httpx_sse
import pytest
from castad_api import dead_letters, keys
from castad_contracts import events
from castad_runtime import db
from opentelemetry.sdk.trace import TracerProvider

from tests.integration.gateway import ago, make_key

pytestmark = pytest.mark.integration


def public_message(code: str) -> str:
    from castad_api import public_errors  # new with these tests

    return public_errors.message(code)


LYRIC, SONG, VIDEO = events.STAGE_ORDER
WORKER = "lyric@castad-lyric-7d9f8c5b4-xk2p9:12"
INTERNAL = ("castad-lyric-7d9f8c5b4", "on attempt 1", "for good", "KeyError", "/srv/castad")


def sse(http: httpx.Client, path: str, last_event_id: str | None = None) -> list[tuple[str, dict]]:
    """Every event of a stream that ends by itself (a pipeline's, once it ended), as (id, data)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    with httpx_sse.connect_sse(http, "GET", path, headers=headers, timeout=httpx.Timeout(10, read=10)) as source:
        assert source.response.status_code == 200, source.response.read()
        return [(event.id, json.loads(event.data)) for event in source.iter_sse() if event.data]


def failed_pipeline_with_a_dead_letter(gateway, engine, tenant: str) -> str:
    with TracerProvider().get_tracer("tests").start_as_current_span("submit"):  # a trace: a trace viewer's link
        pipeline_id = gateway.create(tenant=tenant)
    gateway.event(pipeline_id, LYRIC, "started", 1, ago(seconds=50), worker=WORKER)
    gateway.event(pipeline_id, LYRIC, "retrying", 1, ago(seconds=40), code="provider_unavailable")
    gateway.event(pipeline_id, LYRIC, "started", 2, ago(seconds=30), worker=WORKER)
    gateway.event(pipeline_id, LYRIC, "failed", 2, ago(seconds=20), code="content_refused")
    with db.transaction(engine) as conn:
        dead_letters.record(
            conn,
            {
                "message_id": str(uuid.uuid4()),
                "kind": "message",
                "service": "song",
                "queue": "castad.song",
                "reason": "handler failed 2 times: KeyError('brief') at /srv/castad/handlers.py:88",
                "headers": {},
                "body": b"{}",
                "body_size": 2,
                "pipeline_id": pipeline_id,
            },
        )
    return pipeline_id


def test_a_tenant_sees_its_pipeline_without_worker_names_internal_error_texts_or_dead_letter_reasons(
    gateway, engines, api, installation
):
    engine = engines["api"]
    pipeline_id = failed_pipeline_with_a_dead_letter(gateway, engine, "lena")
    running = api(trace_url="http://jaeger.internal:16686/trace/{trace_id}")
    tenant, admin = running.client(make_key(engine, "lena", keys.Scope.READ)), running.client(installation.api_key)
    paths = (f"/v1/pipelines/{pipeline_id}", f"/v1/pipelines/{pipeline_id}/timeline", "/v1/pipelines")

    shown = {path: tenant.get(path).text for path in paths} | {"events": json.dumps(sse(tenant, paths[0] + "/events"))}
    for path, text in shown.items():
        assert not [word for word in INTERNAL if word in text], path
    assert "jaeger.internal" not in shown[paths[1]]  # the operators' trace viewer

    view, timeline = json.loads(shown[paths[0]]), json.loads(shown[paths[1]])
    assert (view["error_code"], view["error_message"]) == ("content_refused", public_message("content_refused"))
    lyric = view["stages"][0]
    assert lyric["last_error_message"] == public_message("content_refused")
    workers = [attempt["worker"] for attempt in timeline["attempts"]]
    assert len(set(workers)) == 1 and re.fullmatch(r"w-[0-9a-f]{10}", workers[0])  # one worker, named opaquely
    assert [e["worker"] for e in timeline["entries"] if e["status"] == "started"] == workers
    errors = [(e["error"]["code"], e["error"]["message"]) for e in timeline["entries"] if e.get("error")]
    assert errors[:2] == [(code, public_message(code)) for code in ("provider_unavailable", "content_refused")]
    [letter] = [e for e in timeline["entries"] if e["status"] == "dead_letter_recorded"]
    assert (letter["reason"], letter["dead_letter"], letter["detail"]) == (None, None, None)

    # An operator sees what happened, as it happened.
    inside = admin.get(paths[1]).json()
    assert {a["worker"] for a in inside["attempts"]} == {WORKER}
    assert "KeyError('brief')" in json.dumps(inside) and "content_refused for good" in json.dumps(inside)
    assert inside["trace_url"] is not None


def test_a_pipelines_entries_are_numbered_its_own_way_and_a_tenants_stream_ids_tell_no_volume(gateway, engines, api):
    engine = engines["api"]
    running = api(sse_poll_s=0.2, firehose_max_s=3)
    mia = running.client(make_key(engine, "mia", keys.Scope.READ))
    received: list[tuple[str, dict]] = []
    opened = threading.Event()

    def board() -> None:
        with httpx_sse.connect_sse(mia, "GET", "/v1/events", timeout=httpx.Timeout(10, read=10)) as source:
            opened.set()
            received.extend((event.id, json.loads(event.data)) for event in source.iter_sse() if event.data)

    reader = threading.Thread(target=board)
    reader.start()
    assert opened.wait(10)
    ours = gateway.create("Mia's", tenant="mia")
    for n in range(5):  # other tenants' work between ours: their entries take numbers of the platform
        gateway.create(f"Other {n}", tenant="others")
    gateway.event(ours, LYRIC, "started", 1, ago(seconds=-1), worker=WORKER)  # after its request
    gateway.event(ours, LYRIC, "failed", 1, ago(seconds=-2), code="content_refused")
    reader.join(15)

    timeline = mia.get(f"/v1/pipelines/{ours}/timeline").json()
    assert [e["seq"] for e in timeline["entries"]] == [1, 2, 3]
    page = mia.get(f"/v1/pipelines/{ours}/timeline", params={"after": 1, "limit": 1}).json()
    assert ([e["seq"] for e in page["entries"]], page["next_after"]) == ([2], 2)
    assert [event_id for event_id, _ in sse(mia, f"/v1/pipelines/{ours}/events")] == ["1", "2", "3"]
    assert [event_id for event_id, _ in sse(mia, f"/v1/pipelines/{ours}/events", last_event_id="1")] == ["2", "3"]
    # An id beyond its entries (a seq of every tenant's, from before they were numbered per pipeline): all again.
    assert [event_id for event_id, _ in sse(mia, f"/v1/pipelines/{ours}/events", last_event_id="9999")] == [
        "1",
        "2",
        "3",
    ]

    assert [data["seq"] for _, data in received] == [1, 2, 3]
    ids = [event_id for event_id, _ in received]
    assert not any(event_id.isdigit() for event_id in ids) and len(set(ids)) == 3  # opaque: no count in them
    resumed: list[tuple[str, dict]] = []
    with httpx_sse.connect_sse(
        mia, "GET", "/v1/events", headers={"Last-Event-ID": ids[0]}, timeout=httpx.Timeout(10, read=10)
    ) as source:
        resumed.extend((event.id, json.loads(event.data)) for event in source.iter_sse() if event.data)
    assert [event_id for event_id, _ in resumed] == ids[1:]
    # Another tenant's cursor, or one made up, is not one this stream sent: it leads nowhere.
    noor = running.client(make_key(engine, "noor", keys.Scope.READ))
    tampered = ids[0][:5] + ("A" if ids[0][5] != "A" else "B") + ids[0][6:]
    for client, cursor in ((noor, ids[0]), (mia, tampered), (mia, "12")):
        assert client.get("/v1/events", headers={"Last-Event-ID": cursor}).status_code == 422, cursor


def test_every_operator_action_records_the_acting_keys_id_and_name(gateway, engines, api, installation):
    engine = engines["api"]
    running = api()
    with db.transaction(engine) as conn:
        made = keys.create(conn, "olga", frozenset({keys.Scope.OPERATE, keys.Scope.READ}), "olga's night shift")
    operator, admin = running.client(made.key), running.client(installation.api_key)
    pipeline_id = gateway.create(tenant="olga")
    acting = {"X-Castad-Actor": "anyone at all"}

    assert operator.post(f"/v1/pipelines/{pipeline_id}/cancel", headers=acting).status_code == 202
    for stage in events.STAGE_ORDER:
        gateway.event(pipeline_id, stage, "canceled", 0, ago(seconds=1), operation=1)
    assert operator.post(f"/v1/pipelines/{pipeline_id}/retry", headers=acting).status_code == 202

    actions = operator.get(f"/v1/pipelines/{pipeline_id}/timeline").json()["actions"]
    assert [(a["action"], a["actor"], a["actor_key_id"], a["actor_key_name"]) for a in actions] == [
        ("cancel_requested", "anyone at all", str(made.id), "olga's night shift"),
        ("retry_requested", "anyone at all", str(made.id), "olga's night shift"),
    ]

    other = failed_pipeline_with_a_dead_letter(gateway, engine, "olga")
    [letter] = admin.get("/v1/dead-letters", params={"pipeline_id": other}).json()["items"]
    discarded = admin.post(f"/v1/dead-letters/{letter['id']}/discard", json={"reason": "a test"}, headers=acting)
    assert discarded.status_code == 200, discarded.text
    [action] = admin.get(f"/v1/dead-letters/{letter['id']}").json()["actions"]
    admin_key = admin.get("/v1/me").json()
    assert (action["actor"], action["key_id"], action["key_name"]) == (
        "anyone at all",
        admin_key["key_id"],
        admin_key["name"],
    )
    [noted] = [a for a in admin.get(f"/v1/pipelines/{other}/timeline").json()["actions"] if a["dead_letter"]]
    assert (noted["actor_key_id"], noted["actor_key_name"]) == (admin_key["key_id"], admin_key["name"])
    # The tenant sees its own keys' actions by name, not which operator's key acted on its pipeline.
    [seen] = [a for a in operator.get(f"/v1/pipelines/{other}/timeline").json()["actions"] if a["action"]]
    assert (seen["actor_key_id"], seen["actor_key_name"]) == (None, None)
