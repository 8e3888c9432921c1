"""Notices sent several at once, on a real PostgreSQL.

Slow receivers are waited for side by side, one receiving host takes at most its share of the places, and two
deliverers never send one notice twice.
"""

from __future__ import annotations

import base64
import collections
import threading
import time

import httpx
import pytest
import sqlalchemy as sa
from castad_api import settings as api_settings
from castad_api import tables, webhook_slots, webhooks
from castad_contracts import events

from tests.integration.gateway import ago

pytestmark = pytest.mark.integration
SECRET = "whsec_" + base64.b64encode(b"castad: a shared test secret").decode()
ANSWER_S = 0.5


class SlowReceiver:
    """Answers 204 after ANSWER_S, counting the tries it holds at once, in all and per host."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: collections.Counter[str] = collections.Counter()
        self.peak: collections.Counter[str] = collections.Counter()
        self.peak_all = 0
        self.ids: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        with self.lock:
            self.ids.append(request.headers["webhook-id"])
            self.now[host] += 1
            self.peak[host] = max(self.peak[host], self.now[host])
            self.peak_all = max(self.peak_all, self.now.total())
        time.sleep(ANSWER_S)
        with self.lock:
            self.now[host] -= 1
        return httpx.Response(204)


def ended_with_notices(gateway, hosts: list[str]) -> None:
    """A pipeline run to its end for each of `hosts`, each asking for a notice there."""
    for host in hosts:
        pipeline_id = gateway.create(tenant="acme", callback_url=f"https://{host}/hooks")
        for n, stage in enumerate(events.STAGE_ORDER):
            gateway.run(pipeline_id, stage, ago(minutes=5 - n), 1)


def deliverer(engine: sa.Engine, url: str, receiver: SlowReceiver, **settings: int) -> webhooks.Deliverer:
    config = api_settings.ApiSettings(database_url=url, webhook_secret=SECRET, **settings)
    sender = webhooks.Sender(False, 5, transport=httpx.MockTransport(receiver))
    return webhooks.Deliverer(engine, config, sender=sender)


def statuses(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.scalars(sa.select(tables.webhook_deliveries.c.status)))


def test_two_slow_receivers_are_waited_for_side_by_side_not_one_after_the_other(gateway, engines, installation):
    ended_with_notices(gateway, ["93.184.216.34", "93.184.216.35"])
    receiver = SlowReceiver()

    started = time.monotonic()
    tried = deliverer(engines["api"], installation.database_urls["api"], receiver).run_once()

    assert tried == 2 and receiver.peak_all == 2
    assert time.monotonic() - started < 2 * ANSWER_S
    assert statuses(engines["api"]) == ["delivered", "delivered"]


def test_one_host_takes_at_most_its_share_of_the_places_and_the_others_notices_go_meanwhile(
    gateway, engines, installation
):
    ended_with_notices(gateway, ["93.184.216.34"] * 3 + ["93.184.216.35"])
    receiver = SlowReceiver()
    sending = deliverer(
        engines["api"], installation.database_urls["api"], receiver, webhook_concurrency=4, webhook_per_host=2
    )

    assert sending.run_once() == 3  # two to the first host, the other host's one beside them
    assert receiver.peak == {"93.184.216.34": 2, "93.184.216.35": 1}
    assert statuses(engines["api"]) == ["delivered", "delivered", "delivered", "pending"]
    assert sending.run_once() == 1
    assert statuses(engines["api"]) == ["delivered"] * 4


def test_two_deliverers_at_once_send_each_notice_once(gateway, engines, installation):
    ended_with_notices(gateway, [f"93.184.216.{n}" for n in range(30, 36)])
    receiver = SlowReceiver()
    url = installation.database_urls["api"]
    replicas = [deliverer(engines["api"], url, receiver, webhook_concurrency=4, webhook_per_host=4) for _ in range(2)]

    threads = [threading.Thread(target=replica.run_once) for replica in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(collections.Counter(receiver.ids).values()) == [1] * 6
    assert statuses(engines["api"]) == ["delivered"] * 6


def test_the_host_of_a_url_is_read_alike_by_python_and_by_postgresql(engines):
    cases = {
        "https://Example.COM/hooks?a=1": "example.com",
        "http://127.0.0.1:8080/x": "127.0.0.1",
        "https://[2001:db8::1]:443/x": "[2001:db8::1]",
        "https://example.com#frag": "example.com",
    }
    with engines["api"].connect() as conn:
        for url, host in cases.items():
            in_sql = conn.scalar(sa.select(sa.func.lower(sa.func.substring(url, webhook_slots.HOST_PATTERN))))
            assert webhook_slots.host(url) == in_sql == host
