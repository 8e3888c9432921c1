"""Notices sent several at once, on a real PostgreSQL.

Slow receivers are waited for side by side, one receiving host (however its URLs spell it) takes at most its
share of the places, a notice whose tries cannot be recorded holds none, and two deliverers never send one
notice twice.
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
from castad_api import tables, webhook_deliverer, webhook_sender
from castad_contracts import events

from tests.integration.gateway import ago

pytestmark = pytest.mark.integration
SECRET = "whsec_" + base64.b64encode(b"castad: a shared test secret").decode()
ANSWER_S = 0.5


class SlowReceiver:
    """Answers 204 after ANSWER_S, counting the tries it holds at once, in all and per host.

    `begun` and `answered`: when each try began and was answered.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.begun: list[float] = []
        self.answered: list[float] = []
        self.now: collections.Counter[str] = collections.Counter()
        self.peak: collections.Counter[str] = collections.Counter()
        self.peak_all = 0
        self.ids: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        with self.lock:
            self.begun.append(time.monotonic())
            self.ids.append(request.headers["webhook-id"])
            self.now[host] += 1
            self.peak[host] = max(self.peak[host], self.now[host])
            self.peak_all = max(self.peak_all, self.now.total())
        time.sleep(ANSWER_S)
        with self.lock:
            self.now[host] -= 1
            self.answered.append(time.monotonic())
        return httpx.Response(204)


def ended_with_notices(gateway, hosts: list[str]) -> None:
    """A pipeline run to its end for each of `hosts`, each asking for a notice there."""
    for host in hosts:
        pipeline_id = gateway.create(tenant="acme", callback_url=f"https://{host}/hooks")
        for n, stage in enumerate(events.STAGE_ORDER):
            gateway.run(pipeline_id, stage, ago(minutes=5 - n), 1)


def deliverer(engine: sa.Engine, url: str, receiver: SlowReceiver, **settings: float) -> webhook_deliverer.Deliverer:
    config = api_settings.ApiSettings(database_url=url, webhook_secret=SECRET, **settings)
    sender = webhook_sender.Sender(False, 5, transport=httpx.MockTransport(receiver))
    return webhook_deliverer.Deliverer(engine, config, sender=sender)


def statuses(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.scalars(sa.select(tables.webhook_deliveries.c.status)))


def test_two_slow_receivers_are_waited_for_side_by_side_not_one_after_the_other(gateway, engines, installation):
    ended_with_notices(gateway, ["93.184.216.34", "93.184.216.35"])
    receiver = SlowReceiver()

    tried = deliverer(engines["api"], installation.database_urls["api"], receiver).run_once()

    assert tried == 2 and receiver.peak_all == 2
    assert max(receiver.begun) < min(receiver.answered)  # the second was sent before the first was answered
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


def test_every_spelling_of_one_host_shares_its_places(gateway, engines, installation):
    spellings = ["93.184.216.34", "93.184.216.34.", "93.184.216.34:443", "93.184.216.34.:443"]
    ended_with_notices(gateway, spellings)
    receiver = SlowReceiver()
    sending = deliverer(
        engines["api"], installation.database_urls["api"], receiver, webhook_concurrency=4, webhook_per_host=2
    )
    with engines["api"].connect() as conn:
        kept = set(conn.scalars(sa.select(tables.webhook_deliveries.c.host)))

    assert kept == {"93.184.216.34:443"}
    assert sending.run_once() == 2 and receiver.peak_all == 2
    assert sending.run_once() == 2 and receiver.peak_all == 2
    assert statuses(engines["api"]) == ["delivered"] * 4


def test_a_notice_whose_tries_cannot_be_recorded_holds_no_place_and_the_others_still_go(gateway, engines, installation):
    """The record of one notice's tries fails every time (a trigger refuses it); the only place is not jammed.

    Its tries are sent again when their leases end, as if their gateway had died, until the last one.
    """
    ended_with_notices(gateway, ["93.184.216.40", "93.184.216.41", "93.184.216.42", "93.184.216.43"])
    engine = engines["api"]
    deliveries = tables.webhook_deliveries
    with engine.begin() as conn:
        stuck = conn.scalar(sa.select(deliveries.c.id).where(deliveries.c.url == "https://93.184.216.40/hooks"))
        conn.execute(deliveries.update().where(deliveries.c.id == stuck).values(due_at=ago(minutes=10)))  # first
        conn.execute(
            sa.text(
                "CREATE FUNCTION refuse_try() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                f" IF NEW.delivery_id = '{stuck}' THEN RAISE EXCEPTION 'this try is not to be recorded'; END IF;"
                " RETURN NEW; END $$"
            )
        )
        conn.execute(
            sa.text(
                "CREATE TRIGGER refuse_try BEFORE INSERT ON webhook_attempts FOR EACH ROW EXECUTE FUNCTION refuse_try()"
            )
        )
    receiver = SlowReceiver()
    config = {"webhook_concurrency": 1, "webhook_per_host": 1, "webhook_max_attempts": 2, "webhook_poll_s": 0.05}
    sending = deliverer(engine, installation.database_urls["api"], receiver, **config)

    sending.start()
    try:
        deadline = time.monotonic() + 15
        while statuses(engine).count("delivered") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sending.stop()

    assert statuses(engine) == ["delivered", "delivered", "delivered", "pending"]
    assert receiver.ids[0] == str(stuck) and sorted(collections.Counter(receiver.ids).values()) == [1] * 4
    assert sending.slots.in_flight() == 0
    with engine.begin() as conn:
        assert conn.scalar(sa.select(deliveries.c.attempts).where(deliveries.c.id == stuck)) == 1
        conn.execute(deliveries.update().where(deliveries.c.id == stuck).values(due_at=sa.func.now()))  # lease over
    again = deliverer(engine, installation.database_urls["api"], receiver, **config)
    assert again.run_once() == 1 and receiver.ids.count(str(stuck)) == 2
    with engine.begin() as conn:
        conn.execute(deliveries.update().where(deliveries.c.id == stuck).values(due_at=sa.func.now()))  # lease over
    assert again.run_once() == 0  # its last try was sent and never recorded: the notice fails
    with engine.connect() as conn:
        row = conn.execute(sa.select(deliveries).where(deliveries.c.id == stuck)).one()
        recorded = conn.scalar(
            sa.select(sa.func.count())
            .select_from(tables.webhook_attempts)
            .where(tables.webhook_attempts.c.delivery_id == stuck)
        )
    assert (row.status, row.attempts, row.last_error) == ("failed", 2, "no answer was recorded for its last try")
    assert recorded == 0 and again.slots.in_flight() == 0
