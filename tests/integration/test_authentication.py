"""Failed authentication on the gateway's HTTP API.

A bogus key costs no database query (a malformed one none at all, an unknown one once a while), and a client
address that keeps failing is slowed (429 with Retry-After) and counted in castad_api_auth_failures_total, while a
valid key from that address is served as ever.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from castad_api import keys
from castad_runtime import db
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.gateway import make_key

pytestmark = pytest.mark.integration


@pytest.fixture
def key_lookups(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every statement that read the API keys, as the gateway (served from this process) sent it."""
    seen: list[Any] = []
    run = db.run

    def spy(conn: Any, sql: str, *args: Any, **kwargs: Any) -> Any:
        if "FROM api_keys" in sql:
            seen.append(args)
        return run(conn, sql, *args, **kwargs)

    monkeypatch.setattr(db, "run", spy)
    return seen


def failures(running) -> dict[str, float]:
    page = running.client(None).get("/metrics").text
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(page)
        if family.name == "castad_api_auth_failures"
        for sample in family.samples
        if sample.name == "castad_api_auth_failures_total"
    }


def test_a_malformed_key_costs_no_query_and_an_unknown_one_only_its_first_time(api, key_lookups):
    running = api()
    malformed = running.client("not-a-castad-key")
    unknown = running.client(keys.PREFIX + secrets.token_urlsafe(30))

    assert [malformed.get("/v1/me").status_code for _ in range(3)] == [401] * 3
    assert key_lookups == []
    assert [unknown.get("/v1/me").status_code for _ in range(3)] == [401] * 3
    assert len(key_lookups) == 1
    assert failures(running) == {"malformed": 3.0, "unknown": 3.0, "missing": 0.0, "throttled": 0.0}


def test_a_client_that_keeps_failing_is_slowed_and_counted_and_a_valid_key_from_its_address_is_still_served(
    api, engines, key_lookups
):
    """Behind a load balancer or a NAT every tenant may share an address with a bad client: only failures are slowed."""
    running = api(auth_failure_burst=3, auth_failures_per_s=0.01)
    bogus = running.client(keys.PREFIX + secrets.token_urlsafe(30))
    anonymous = running.client(None)

    answers = [bogus.get("/v1/pipelines"), anonymous.get("/v1/pipelines"), bogus.get("/v1/pipelines")]
    assert [answer.status_code for answer in answers] == [401, 401, 401]
    refused = bogus.get("/v1/pipelines")
    assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 100
    assert anonymous.get("/v1/pipelines").status_code == 429
    assert len(key_lookups) == 1  # the bogus key is known to be bad: no second look-up
    for tenant in ("hana", "dana"):  # two tenants' valid keys, from the same address
        valid = running.client(make_key(engines["api"], tenant, keys.Scope.READ))
        assert [valid.get("/v1/pipelines").status_code for _ in range(3)] == [200] * 3
    # Keys made up from that address: looked up within the throttled client's budget (three of its five left), then
    # refused unlooked-at; the valid keys it used are still served.
    made_up = [running.client(keys.PREFIX + secrets.token_urlsafe(30)).get("/v1/pipelines") for _ in range(4)]
    assert [answer.status_code for answer in made_up] == [429] * 4
    assert len(key_lookups) == 1 + 2 * 3 + 3
    assert valid.get("/v1/pipelines").status_code == 200
    assert failures(running) == {"missing": 1.0, "malformed": 0.0, "unknown": 2.0, "throttled": 6.0}
