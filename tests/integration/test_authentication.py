"""Failed authentication on the gateway's HTTP API.

A bogus key costs no database query (a malformed one none at all, an unknown one once a while), and a client
address that keeps failing is slowed (429 with Retry-After) and counted in castad_api_auth_failures_total.
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


def test_a_client_that_keeps_failing_is_slowed_before_any_lookup_and_counted(api, engines, key_lookups):
    running = api(auth_failure_burst=3, auth_failures_per_s=0.01)
    bogus = running.client(keys.PREFIX + secrets.token_urlsafe(30))
    anonymous = running.client(None)

    answers = [bogus.get("/v1/pipelines"), anonymous.get("/v1/pipelines"), bogus.get("/v1/pipelines")]
    assert [answer.status_code for answer in answers] == [401, 401, 401]
    refused = bogus.get("/v1/pipelines")
    assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 100
    # The address is slowed whatever the key: nothing is looked up until the bucket fills again.
    valid = running.client(make_key(engines["api"], "hana", keys.Scope.READ))
    assert valid.get("/v1/pipelines").status_code == 429
    assert len(key_lookups) == 1
    assert failures(running) == {"missing": 1.0, "malformed": 0.0, "unknown": 2.0, "throttled": 2.0}
