"""Metering and budgets end to end, every stage on its network provider's fake, every service its own process.

Two tenants' briefs go through; what GET /v1/usage says each tenant used is what the providers' fakes counted
of each tenant's work. A budget reached mid-burst refuses the next brief, naming the limit and when it resets, and
every brief accepted before it finishes.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from castad_api import keys, usage
from castad_cli import client as client_
from castad_contracts import topology
from castad_local import stack
from castad_runtime import db
from castad_testkit import briefs

from tests.support import network

pytestmark = pytest.mark.e2e


@pytest.fixture
def providers() -> Iterator[network.Fakes]:
    with network.fakes(song_s=1.0, audio_s=2.0, render_s=0.5) as running:
        yield running


def make_key(database_url: str, tenant: str) -> str:
    engine = db.make_engine(database_url)
    try:
        with db.transaction(engine) as conn:
            return keys.create(conn, tenant, frozenset({keys.Scope.SUBMIT, keys.Scope.READ}), tenant).key
    finally:
        engine.dispose()


def whose(body: object, owners: dict[str, str]) -> str:
    """The tenant whose pipeline (or customer) a request's body names."""
    text = json.dumps(body, ensure_ascii=False)
    [tenant] = {tenant for name, tenant in owners.items() if name in text}
    return tenant


@pytest.mark.timeout(240)
def test_each_tenants_usage_is_what_the_providers_counted_and_a_budget_reached_mid_burst_refuses_the_next(
    castad, providers, dbs
):
    lyrics, music, render = providers
    port = stack.free_port()
    running = castad({"CASTAD_API_PORT": str(port), **network.env(providers, f"http://127.0.0.1:{port}", 30)})
    first, second = f"a{uuid.uuid4().hex[:8]}", f"b{uuid.uuid4().hex[:8]}"
    database_url = running.installation.database_urls["api"]
    engine = db.make_engine(database_url)
    with db.transaction(engine) as conn:
        usage.set_budget(conn, first, usage.Limits("day", 3, None, None))
    engine.dispose()
    clients = {
        tenant: client_.Client(running.base_url, api_key=make_key(database_url, tenant)) for tenant in (first, second)
    }
    customers = {first: [f"알파상회 {n}" for n in range(4)], second: [f"베타식당 {n}" for n in range(2)]}

    accepted: dict[str, str] = {}  # pipeline -> tenant
    refused = []
    for tenant in (first, second):
        for customer in customers[tenant]:
            try:
                accepted[clients[tenant].submit(briefs.sample(customer)).id] = tenant
            except client_.GatewayError as error:
                refused.append((tenant, error))

    assert [tenant for tenant, _ in refused] == [first]  # its fourth: the day's three are made
    error = refused[0][1]
    tomorrow = dt.datetime.combine(dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1), dt.time(), dt.UTC)
    assert error.status == 429
    assert f"{first}'s daily budget of 3 pipelines is reached; it resets at {tomorrow.isoformat()}" in str(error)
    views = running.wait_terminal(list(accepted), timeout_s=150)
    assert {view.status for view in views.values()} == {"SUCCEEDED"}  # every accepted one finishes
    for stage in topology.STAGES:  # each stage took its turns by whose work it was
        jobs = dbs.jobs_of(stage, list(accepted))
        assert {job["pipeline_id"]: job["tenant"] for job in jobs} == accepted, stage

    owners = {pipeline_id: tenant for pipeline_id, tenant in accepted.items()}
    owners |= {customer: tenant for tenant, names in customers.items() for customer in names}
    counted = {
        "lyric_calls": Counter(whose(body, owners) for body in lyrics.received),
        "song_calls": Counter(
            whose(r["body"], owners) for r in music.received if (r["method"], r["path"]) == ("POST", "/api/v1/generate")
        ),
        "video_calls": Counter(
            whose(r["body"], owners) for r in render.received if (r["method"], r["path"]) == ("POST", "/v2/renders")
        ),
    }
    for tenant in (first, second):
        used = running.wait_until(
            f"{tenant}'s usage counted",
            lambda t=tenant: (read := clients[t].usage()).total.video_seconds > 0 and read,
        )
        total = used.total
        assert total.pipelines == len(customers[tenant][:3])
        assert {meter: getattr(total, meter) for meter in counted} == {
            meter: counts[tenant] for meter, counts in counted.items()
        }
        assert total.lyric_calls >= total.pipelines and total.song_calls >= total.pipelines  # each asked for
        assert total.song_seconds == pytest.approx(2.0 * total.pipelines, abs=0.5 * total.pipelines)
        assert total.stored_bytes > 0
    for each in clients.values():
        each.close()
