"""Who may do what at the gateway, every service its own process.

API keys with tenants and scopes, 401 without a valid key, 403 without the scope, 404 for another tenant's pipeline
(on every route that names one), idempotency keys per tenant, rotation, and one creation limit shared by two
gateway processes.
"""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
from castad_api import keys, tables
from castad_local import access, stack
from castad_testkit import briefs

pytestmark = pytest.mark.e2e
ALL = frozenset(keys.Scope)
TENANT = frozenset({keys.Scope.SUBMIT, keys.Scope.READ, keys.Scope.OPERATE})


def key_for(installation, tenant: str, scopes: frozenset[keys.Scope] = TENANT) -> str:
    return access.create_key(tenant, scopes, f"{tenant} test key", installation.env())


def as_key(base_url: str, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.Client(base_url=base_url, timeout=10, headers=headers)


def submit(http: httpx.Client, idempotency_key: str | None = None) -> httpx.Response:
    headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key or str(uuid.uuid4())}
    return http.post("/v1/pipelines", content=briefs.sample().model_dump_json(), headers=headers)


def routes_of(pipeline_id: str) -> list[tuple[str, str]]:
    base = f"/v1/pipelines/{pipeline_id}"
    return [
        ("GET", base),
        ("GET", f"{base}/events"),
        ("GET", f"{base}/artifacts/lyric"),
        ("GET", f"{base}/webhooks"),
        ("GET", f"{base}/timeline"),
        ("POST", f"{base}/cancel"),
        ("POST", f"{base}/retry"),
    ]


def created(http: httpx.Client) -> float:
    """The gateway's count of pipelines created, from its /metrics."""
    found = re.search(r"^castad_pipelines_created_total (\S+)$", http.get("/metrics").text, re.M)
    assert found is not None
    return float(found.group(1))


@pytest.mark.timeout(180)
def test_keys_tenants_and_scopes_decide_who_sees_and_does_what(shared):
    running, installation = shared, shared.installation
    alice_tenant, bob_tenant = f"alice-{shared.tenant}", f"bob-{shared.tenant}"
    alice, bob = key_for(installation, alice_tenant), key_for(installation, bob_tenant)
    reader = key_for(installation, alice_tenant, frozenset({keys.Scope.READ}))
    submitter = key_for(installation, alice_tenant, frozenset({keys.Scope.SUBMIT}))

    with as_key(running.base_url, alice) as a, as_key(running.base_url, bob) as b:
        before = created(a)
        accepted = submit(a)
        assert accepted.status_code == 202
        pipeline_id = accepted.json()["id"]
        running.admin.wait_terminal([pipeline_id])

        # No key, or a wrong one: 401 everywhere but the probes.
        with as_key(running.base_url, None) as anonymous, as_key(running.base_url, "cad_not-a-key") as wrong:
            for client in (anonymous, wrong):
                assert submit(client).status_code == 401
                assert client.get("/v1/pipelines").status_code == 401
                assert client.get("/v1/dead-letters").status_code == 401
                for method, path in routes_of(pipeline_id):
                    answer = client.request(method, path)
                    assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer", path
            assert anonymous.get("/healthz").status_code == 200 and anonymous.get("/readyz").status_code == 200
            # /metrics too, and it names no pipeline and no tenant.
            page = anonymous.get("/metrics")
            assert page.status_code == 200 and created(anonymous) == before + 1
            assert pipeline_id not in page.text and alice_tenant not in page.text

        # Another tenant: the pipeline does not exist, on every route that names it, and is not listed.
        for method, path in routes_of(pipeline_id):
            answer = b.request(method, path)
            # Exactly what a pipeline that does not exist gets: no hint that this one does.
            assert (answer.status_code, answer.json()) == (404, {"detail": f"no pipeline {pipeline_id}"}), path
        assert pipeline_id not in {p["id"] for p in b.get("/v1/pipelines").json()["items"]}
        assert pipeline_id in {p["id"] for p in a.get("/v1/pipelines").json()["items"]}
        assert b.post(f"/v1/provider-callbacks/lyric/{pipeline_id}").status_code in (401, 422)  # needs a signed link

        # Scopes: a missing one is a 403; admin sees every tenant and the dead letters.
        with as_key(running.base_url, reader) as r, as_key(running.base_url, submitter) as s:
            assert submit(r).status_code == 403
            assert r.post(f"/v1/pipelines/{pipeline_id}/retry").status_code == 403
            assert r.get(f"/v1/pipelines/{pipeline_id}").status_code == 200
            assert s.get(f"/v1/pipelines/{pipeline_id}").status_code == 403
            assert s.get("/v1/dead-letters").status_code == 403
        assert a.get("/v1/dead-letters").status_code == 403
        assert running.admin.http.get(f"/v1/pipelines/{pipeline_id}").status_code == 200  # the tests' admin key
        assert running.admin.http.get("/v1/dead-letters").status_code == 200

        # An Idempotency-Key is the tenant's own.
        same = f"same-{uuid.uuid4()}"
        first, second, again = submit(a, same), submit(b, same), submit(a, same)
        assert {first.status_code, second.status_code, again.status_code} == {202}
        assert first.json()["id"] != second.json()["id"] and again.json()["id"] == first.json()["id"]


@pytest.mark.timeout(120)
def test_a_key_is_rotated_without_downtime(shared):
    running, installation, dbs = shared, shared.installation, shared.dbs
    old = key_for(installation, shared.tenant)
    new = key_for(installation, shared.tenant)  # both valid at once while clients move over
    with as_key(running.base_url, old) as before, as_key(running.base_url, new) as after:
        pipeline_id = submit(before).json()["id"]
        assert after.get(f"/v1/pipelines/{pipeline_id}").status_code == 200  # same tenant, same pipelines

        [old_id] = [row["id"] for row in dbs.rows("api", tables.api_keys.select()) if row["shown"] == old[:12]]
        assert access.revoke_key(old_id, installation.env())

        assert before.get(f"/v1/pipelines/{pipeline_id}").status_code == 401
        assert after.get(f"/v1/pipelines/{pipeline_id}").status_code == 200


@pytest.mark.timeout(120)
def test_one_creation_limit_holds_across_two_gateway_processes(castad, installation):
    running = castad({"CASTAD_API_CREATIONS_PER_MINUTE": "4"}, only=("api",))  # two gateways, nothing else
    second_port = stack.free_port()
    running.services.commands["api-2"] = running.services.commands["api"]
    running.services.start("api-2", {"CASTAD_API_PORT": str(second_port)})
    second = f"http://127.0.0.1:{second_port}"
    running.services.wait_ready(second)
    key = key_for(installation, "dave")

    answers = []
    with as_key(running.base_url, key) as one, as_key(second, key) as two:
        for n in range(12):  # alternately to each gateway
            answers.append(submit(one if n % 2 == 0 else two))

    statuses = [answer.status_code for answer in answers]
    refused = [answer for answer in answers if answer.status_code == 429]
    assert set(statuses) == {202, 429}, statuses
    assert statuses.count(202) <= 8  # 4 a minute; the run may span the turn of one minute
    assert all(1 <= int(answer.headers["retry-after"]) <= 60 for answer in refused)
    assert "4 pipelines a minute" in refused[0].json()["detail"]
