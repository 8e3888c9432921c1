"""A brief's callback_url hears of the pipeline's end, every service its own process.

One notice per ending, signed as Standard Webhooks with its tenant's own secret, tried again after a failed try,
every try recorded.
"""

from __future__ import annotations

import base64
import collections
import json
import threading

import pytest
from castad_api.commands import webhook_secrets as secret_commands
from castad_contracts import topology
from castad_local import access
from castad_local.fakes import server
from castad_testkit import briefs
from standardwebhooks import Webhook

from tests.support.installation import TEST_KEY_TENANT

pytestmark = pytest.mark.e2e

SEALING_KEY = base64.b64encode(b"castad: end-to-end sealing key32").decode()


class Receiver(server.FakeServer):
    """Answers each POST with the next scripted status (then 204), keeping what it received."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = collections.deque(statuses)
        self.received: list[server.Request] = []
        self._lock = threading.Lock()
        super().__init__()

    def handle(self, request: server.Request) -> server.Response:
        with self._lock:
            self.received.append(request)
            return server.Response(self.statuses.popleft() if self.statuses else 204)


@pytest.mark.timeout(120)
def test_the_end_of_a_pipeline_is_told_to_its_callback_url_signed_and_retried(castad, installation):
    sealing = {"CASTAD_API_WEBHOOK_SECRETS_KEY": SEALING_KEY}
    secret = secret_commands.create_secret(access.gateway_settings({**installation.env(), **sealing}), TEST_KEY_TENANT)
    with Receiver(503) as receiver:
        running = castad(
            {
                **sealing,
                "CASTAD_API_WEBHOOK_ALLOW_PRIVATE": "true",  # the receiver listens on 127.0.0.1
                "CASTAD_API_WEBHOOK_BACKOFF_BASE_S": "0.2",
                "CASTAD_API_WEBHOOK_POLL_S": "0.2",
            }
        )
        body = {**briefs.sample("알림책방").model_dump(mode="json"), "callback_url": f"{receiver.url}/hooks/castad?k=1"}

        accepted = running.http.post("/v1/pipelines", json=body, headers={"Idempotency-Key": "webhook-1"})
        pipeline_id = accepted.json()["id"]
        view = running.wait_terminal([pipeline_id])[pipeline_id]
        deliveries = running.wait_until(
            "the notice delivered",
            lambda: [
                d for d in running.http.get(f"/v1/pipelines/{pipeline_id}/webhooks").json() if d["status"] != "pending"
            ],
        )

    [delivery] = deliveries
    assert (delivery["status"], delivery["event_type"], delivery["attempts"]) == ("delivered", "pipeline.succeeded", 2)
    assert [(t["number"], t["status_code"]) for t in delivery["tries"]] == [(1, 503), (2, 204)]
    first, second = receiver.received
    assert first.path == second.path == "/hooks/castad" and first.query == "k=1"
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery["id"]
    notice = Webhook(secret).verify(second.body, second.headers)
    assert notice["type"] == "pipeline.succeeded"
    assert (notice["data"]["id"], notice["data"]["status"], notice["data"]["tenant"]) == (
        pipeline_id,
        "SUCCEEDED",
        TEST_KEY_TENANT,
    )
    assert set(notice["data"]["artifacts"]) == set(topology.STAGES)
    assert "callback_url" not in view.brief.model_dump()  # it stays with the gateway: no stage sees it
    assert json.loads(first.body) == json.loads(second.body)
