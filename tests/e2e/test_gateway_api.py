"""The gateway's contract at its edge: idempotent submission, clean 4xx for bad input, health, resumable events."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from castad_api import repository
from castad_contracts import topology
from castad_runtime import release

pytestmark = pytest.mark.e2e

JSON = {"Content-Type": "application/json"}
GOOD = {"customer_name": "Cafe Blue", "region": "Busan", "language": "English", "genre": "jazz", "duration_s": 3}


async def _submit_concurrently(running, key: str, body: dict, count: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=running.base_url, timeout=30, headers=running.http.headers) as http:
        return await asyncio.gather(
            *(http.post("/v1/pipelines", json=body, headers={"Idempotency-Key": key}) for _ in range(count))
        )


def _field_errors(response: httpx.Response) -> list[str]:
    """The locations a 422 names, as dotted paths ("body.duration_s")."""
    detail = response.json()["detail"]
    if isinstance(detail, str):
        return [detail]
    return [".".join(map(str, problem["loc"])) for problem in detail]


@pytest.mark.timeout(120)
def test_one_idempotency_key_submitted_twenty_times_at_once_is_one_pipeline(shared):
    running, dbs = shared, shared.dbs
    key = f"e2e-{uuid.uuid4()}"
    tenants_pipelines = dbs.pipelines.select().where(dbs.pipelines.c.tenant == shared.tenant)

    responses = asyncio.run(_submit_concurrently(running, key, GOOD, 20))

    assert [r.status_code for r in responses] == [202] * 20, [r.text for r in responses if r.status_code != 202]
    bodies = [r.json() for r in responses]
    pipeline_id = bodies[0]["id"]
    assert {b["id"] for b in bodies} == {pipeline_id}
    assert sum(b["created"] for b in bodies) == 1
    base = f"/v1/pipelines/{pipeline_id}"
    links = {"self": base, "events": f"{base}/events", "cancel": f"{base}/cancel", "retry": f"{base}/retry"}
    assert bodies[0]["links"] == links
    kept = repository.tenant_key(shared.tenant, key)
    rows = dbs.rows("api", dbs.pipelines.select().where(dbs.pipelines.c.idempotency_key == kept))
    assert [str(row["id"]) for row in rows] == [pipeline_id]
    assert len(dbs.rows("api", tenants_pipelines)) == 1
    assert [r["routing_key"] for r in dbs.outbox_of("api", pipeline_id)] == ["pipeline.requested"]

    # The same key later: the same pipeline, not a new one. A different body: a clear 409.
    again = running.http.post("/v1/pipelines", json=GOOD, headers={"Idempotency-Key": key})
    assert again.status_code == 202 and again.json()["id"] == pipeline_id and again.json()["created"] is False
    other = running.http.post("/v1/pipelines", json=GOOD | {"region": "Seoul"}, headers={"Idempotency-Key": key})
    assert other.status_code == 409
    assert "Idempotency-Key" in other.json()["detail"] and key in other.json()["detail"]
    assert len(dbs.rows("api", tenants_pipelines)) == 1

    # And it runs once: one job per stage.
    assert running.wait_terminal([pipeline_id])[pipeline_id].status == "SUCCEEDED"
    for service in topology.STAGES:
        assert [job["pipeline_id"] for job in dbs.jobs_of(service, [pipeline_id])] == [pipeline_id]

    # Its event stream resumes after the id it is given, with only the later events.
    events = running.events(pipeline_id)
    assert [(e["step"], e["status"]) for _, _, e in events][-1] == ("video", "completed")
    assert events[-1][2]["pipeline_status"] == "SUCCEEDED" and events[-1][2]["progress"] == 100
    assert set(events[-1][2]["artifacts"]) == set(topology.STAGES)
    middle = len(events) // 2
    assert running.events(pipeline_id, last_event_id=events[middle][0]) == events[middle + 1 :]
    for bad_id in ("x1", "\u00b2".encode("latin-1"), "9" * 5000):
        bad_resume = running.http.get(f"/v1/pipelines/{pipeline_id}/events", headers={"Last-Event-ID": bad_id})
        assert bad_resume.status_code == 422 and "Last-Event-ID" in bad_resume.text, bad_id


@pytest.mark.timeout(120)
def test_bad_requests_get_a_4xx_naming_the_problem_and_never_a_5xx(castad, dbs):
    running = castad({"CASTAD_API_MAX_BODY_BYTES": "2048"}, only=("api",))  # the gateway's edge alone
    http = running.http

    def post(body: object, headers: dict[str, str] | None = None, raw: bytes | None = None) -> httpx.Response:
        content = raw if raw is not None else json.dumps(body).encode()
        all_headers = JSON | {"Idempotency-Key": str(uuid.uuid4())} | (headers or {})
        return http.post("/v1/pipelines", content=content, headers=all_headers)

    field_cases = {
        "missing customer_name": ({k: v for k, v in GOOD.items() if k != "customer_name"}, "body.customer_name"),
        "empty customer_name": (GOOD | {"customer_name": "   "}, "body.customer_name"),
        "missing region": ({k: v for k, v in GOOD.items() if k != "region"}, "body.region"),
        "bad orientation": (GOOD | {"orientation": "diagonal"}, "body.orientation"),
        "bad genre": (GOOD | {"genre": "x" * 101}, "body.genre"),
        "empty genre": (GOOD | {"genre": "  "}, "body.genre"),
        "bad language": (GOOD | {"language": "Klingon"}, "body.language"),
        "duration_s too short": (GOOD | {"duration_s": 2}, "body.duration_s"),
        "duration_s too long": (GOOD | {"duration_s": 181}, "body.duration_s"),
        "duration_s not a number": (GOOD | {"duration_s": "long"}, "body.duration_s"),
        "control character": (GOOD | {"customer_name": "Cafe\x07Blue"}, "body.customer_name"),
        "control character in details": (GOOD | {"detail_region_info": "a\x1bb"}, "body.detail_region_info"),
        "name too long": (GOOD | {"customer_name": "x" * 81}, "body.customer_name"),
        "unknown field": (GOOD | {"colour": "blue"}, "body.colour"),
        "callback_url not http": (GOOD | {"callback_url": "ftp://example.com/x"}, "body.callback_url"),
        "callback_url without a webhook secret": (
            GOOD | {"callback_url": "https://example.com/x"},
            "body.callback_url",
        ),
    }
    for case, (body, field) in field_cases.items():
        response = post(body)
        assert response.status_code == 422, (case, response.status_code, response.text)
        assert field in _field_errors(response), (case, response.text)

    missing_key = http.post("/v1/pipelines", json=GOOD)
    assert missing_key.status_code == 422 and "header.Idempotency-Key" in _field_errors(missing_key)
    bad_key = post(GOOD, headers={"Idempotency-Key": "has spaces"})
    assert bad_key.status_code == 422 and "header.Idempotency-Key" in _field_errors(bad_key)

    # Raw JSON that decodes to what a brief cannot hold, or JSON cannot echo back.
    raw_cases = {
        "lone surrogate, escaped": (rb'{"customer_name": "\ud800", "region": "x"}', "body.customer_name"),
        "lone surrogate, raw bytes": (b'{"customer_name": "x", "region": "\xed\xa0\x80"}', "body.region"),
        "NUL character": (rb'{"customer_name": "a\u0000b", "region": "x"}', "body.customer_name"),
        "infinite duration_s": (b'{"customer_name": "a", "region": "x", "duration_s": 1e400}', "body.duration_s"),
        "empty body": (b"", "body"),
        "null body": (b"null", "body"),
    }
    for case, (raw, field) in raw_cases.items():
        response = post(None, raw=raw)
        assert response.status_code == 422, (case, response.status_code, response.text)
        assert field in _field_errors(response), (case, response.text)
        json.loads(response.content, parse_constant=pytest.fail)  # strict JSON: no NaN or Infinity
    not_utf8 = post(None, raw=b"\xff\xfe{")
    assert not_utf8.status_code == 400, not_utf8.text

    not_json = post(None, raw=b"{customer_name: Cafe Blue")
    assert not_json.status_code == 422, not_json.text
    assert not_json.json()["detail"][0]["type"] == "json_invalid"
    not_an_object = post([GOOD])
    assert not_an_object.status_code == 422, not_an_object.text

    wrong_type = http.post(
        "/v1/pipelines",
        content=json.dumps(GOOD).encode(),
        headers={"Content-Type": "text/plain", "Idempotency-Key": str(uuid.uuid4())},
    )
    assert wrong_type.status_code == 415 and "application/json" in wrong_type.json()["detail"]
    form = http.post("/v1/pipelines", data=GOOD, headers={"Idempotency-Key": str(uuid.uuid4())})
    assert form.status_code == 415

    oversized = post(GOOD | {"detail_region_info": "x" * 400, "pad": "y" * 4000})
    assert oversized.status_code == 413 and "2048" in oversized.json()["detail"]

    def chunks():
        yield b'{"customer_name": "Cafe", "region": "Busan", "detail_region_info": "'
        for _ in range(10):
            yield b"z" * 500
        yield b'"}'

    streamed = http.post(
        "/v1/pipelines", content=chunks(), headers=JSON | {"Idempotency-Key": str(uuid.uuid4())}
    )  # chunked: no Content-Length to reject up front
    assert streamed.status_code == 413 and "2048" in streamed.json()["detail"]

    assert http.get(f"/v1/pipelines/{uuid.uuid4()}").status_code == 404
    assert "no pipeline" in http.get(f"/v1/pipelines/{uuid.uuid4()}").json()["detail"]
    assert http.get("/v1/pipelines/not-a-uuid").status_code == 422
    assert http.get(f"/v1/pipelines/{uuid.uuid4()}/artifacts/video").status_code == 404
    assert http.get(f"/v1/pipelines/{uuid.uuid4()}/artifacts/poster").status_code == 422
    for params in ({"status": "DONE"}, {"stage": "mastering"}, {"limit": 0}, {"cursor": "!!"}):
        response = http.get("/v1/pipelines", params=params)
        assert response.status_code == 422, (params, response.text)
        assert next(iter(params)) in response.text

    # None of it was accepted, and the gateway is healthy and ready.
    assert dbs.rows("api", dbs.pipelines.select()) == []
    assert dbs.outbox_of("api") == []
    assert http.get("/healthz").json() == {"status": "ok", "release": release.of("api")}
    ready = http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"database": "ok", "rabbitmq": "ok"}}
    assert http.get("/v1/pipelines").json() == {"items": [], "next_cursor": None}

    # A valid brief right after all that is accepted (the defaults filled in).
    accepted = post({"customer_name": "Cafe Blue", "region": "Busan"})
    assert accepted.status_code == 202, accepted.text
    view = running.client.status(accepted.json()["id"])
    assert view.brief.duration_s == 30 and view.brief.language.value == "Korean"
