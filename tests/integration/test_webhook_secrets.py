"""Webhook secrets per tenant, on a real PostgreSQL.

A notice verifies only with its own tenant's secret (no tenant can forge another's), names its tenant, carries a
signature per valid secret while a rotation overlaps, and the secrets are made and shown once by the command line
and kept sealed.
"""

from __future__ import annotations

import base64
import json
import uuid

import httpx
import pytest
import sqlalchemy as sa
from castad_api import keys, tables, webhook_deliverer, webhook_secrets, webhook_sender
from castad_api import settings as api_settings
from castad_api.commands import webhook_secrets as secret_commands
from castad_contracts import events
from castad_runtime import db
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from typer.testing import CliRunner

from tests.integration.gateway import ago, make_key

pytestmark = pytest.mark.integration
KEY = base64.b64encode(b"castad: the tests' sealing key!!").decode()
PUBLIC = "93.184.216.34"  # a literal public address: no DNS involved


@pytest.fixture
def config(installation) -> api_settings.ApiSettings:
    return api_settings.ApiSettings(database_url=installation.database_urls["api"], webhook_secrets_key=KEY)


class Receiver:
    """What the deliverer sent, answered 204."""

    def __init__(self) -> None:
        self.received: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.received.append(request)
        return httpx.Response(204)

    def verify(self, secret: str) -> dict:
        request = self.received[-1]
        return Webhook(secret).verify(request.content, dict(request.headers))


def deliver_end_of_a_pipeline(gateway, engine: sa.Engine, config, tenant: str) -> Receiver:
    """A pipeline of `tenant` with a callback_url run to its end, and its notice delivered to a Receiver."""
    pipeline_id = gateway.create(tenant=tenant, callback_url=f"https://{PUBLIC}/hooks")
    for n, stage in enumerate(events.STAGE_ORDER):
        gateway.run(pipeline_id, stage, ago(minutes=5 - n), 1)
    receiver = Receiver()
    sender = webhook_sender.Sender(False, 5, transport=httpx.MockTransport(receiver))
    assert webhook_deliverer.Deliverer(engine, config, sender=sender).run_once() == 1
    return receiver


def make_secret(config, tenant: str) -> str:
    return secret_commands.create_secret(config, tenant)


def test_a_notice_verifies_only_with_its_own_tenants_secret_so_no_tenant_can_forge_anothers(gateway, engines, config):
    alice, bob = make_secret(config, "alice"), make_secret(config, "bob")

    receiver = deliver_end_of_a_pipeline(gateway, engines["api"], config, "bob")

    notice = receiver.verify(bob)
    assert (notice["type"], notice["data"]["tenant"], notice["data"]["status"]) == (
        "pipeline.succeeded",
        "bob",
        "SUCCEEDED",
    )
    with pytest.raises(WebhookVerificationError):
        receiver.verify(alice)  # what alice holds signs nothing bob's receiver accepts


def test_a_rotated_secret_signs_beside_the_new_one_until_its_overlap_ends_and_never_three_at_once(
    gateway, engines, config
):
    engine = engines["api"]
    first = make_secret(config, "carol")
    second = secret_commands.rotate_secret(config, "carol", overlap_s=3600)

    during = deliver_end_of_a_pipeline(gateway, engine, config, "carol")
    assert len(during.received[-1].headers["webhook-signature"].split(" ")) == 2
    assert during.verify(first)["data"]["tenant"] == during.verify(second)["data"]["tenant"] == "carol"

    third = secret_commands.rotate_secret(config, "carol", overlap_s=3600)  # the first one's overlap ends now
    after = deliver_end_of_a_pipeline(gateway, engine, config, "carol")
    assert len(after.received[-1].headers["webhook-signature"].split(" ")) == 2
    after.verify(second), after.verify(third)
    with pytest.raises(WebhookVerificationError):
        after.verify(first)

    with db.transaction(engine) as conn:
        _, second_row, _ = webhook_secrets.listing(conn, "carol")  # oldest first
        assert webhook_secrets.revoke(conn, second_row.id)
    alone = deliver_end_of_a_pipeline(gateway, engine, config, "carol")
    assert len(alone.received[-1].headers["webhook-signature"].split(" ")) == 1
    alone.verify(third)


def test_a_notice_of_a_tenant_without_a_valid_secret_is_not_sent_and_says_why(gateway, engines, config):
    receiver = deliver_end_of_a_pipeline(gateway, engines["api"], config, "dora")

    assert receiver.received == []
    with engines["api"].connect() as conn:
        [row] = conn.execute(sa.select(tables.webhook_deliveries)).all()
    assert row.status == "pending" and "webhook-secrets create --tenant dora" in row.last_error


def test_a_secret_is_shown_once_when_made_and_kept_only_sealed(installation, engines):
    env = {"CASTAD_API_DATABASE_URL": installation.database_urls["api"], "CASTAD_API_WEBHOOK_SECRETS_KEY": KEY}
    runner = CliRunner()

    made = runner.invoke(secret_commands.app, ["create", "--tenant", "erin"], env=env)
    again = runner.invoke(secret_commands.app, ["create", "--tenant", "erin"], env=env)
    listed = runner.invoke(secret_commands.app, ["list"], env=env)

    assert made.exit_code == 0, made.output
    secret = made.output.strip()
    assert secret.startswith("whsec_")
    assert again.exit_code != 0 and "rotate" in again.output  # one current secret: a second is a rotation
    assert listed.exit_code == 0 and "erin" in listed.output and secret not in listed.output
    with engines["api"].connect() as conn:
        [row] = conn.execute(sa.select(tables.webhook_secrets)).all()
    raw = base64.b64decode(secret.removeprefix("whsec_"))
    assert raw not in row.sealed and secret.encode() not in row.sealed and row.tenant == "erin"


def test_a_brief_with_a_callback_url_is_refused_for_a_tenant_without_a_secret(api, engines, config):
    running = api(webhook_secrets_key=KEY, webhook_allow_private=True)
    make_secret(config, "fred")
    body = {"customer_name": "Cafe Blue", "region": "Busan", "callback_url": "http://127.0.0.1:9/hook"}

    answers = {}
    for tenant in ("fred", "gina"):
        http = running.client(make_key(engines["api"], tenant, keys.Scope.SUBMIT))
        answers[tenant] = http.post("/v1/pipelines", json=body, headers={"Idempotency-Key": str(uuid.uuid4())})

    assert answers["fred"].status_code == 202, answers["fred"].text
    assert answers["gina"].status_code == 422
    assert "webhook-secrets create --tenant gina" in json.dumps(answers["gina"].json())
