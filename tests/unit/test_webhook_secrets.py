"""Each tenant's webhook secrets.

Sealed with the gateway's key so that its database alone reveals none, each bound to its tenant, and a notice
signed with every valid one while a rotation overlaps (Standard Webhooks' space-separated signatures, checked by
that project's own library).
"""

from __future__ import annotations

import base64
import time
import uuid

import pytest
from castad_api import settings, webhook_secrets, webhook_sender, webhooks
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

KEY = base64.b64encode(b"castad: the tests' sealing key!!").decode()  # 32 bytes
OTHER_KEY = base64.b64encode(b"castad: another sealing key, 32B").decode()
BODY = b'{"type":"pipeline.succeeded","data":{"id":"p","tenant":"bob"}}'


def test_a_sealed_secret_opens_only_with_its_key_for_its_own_tenant_and_id():
    sealer = webhook_secrets.Sealer.of(KEY)
    secret_id = uuid.uuid4()
    raw = webhook_secrets.new_secret()

    sealed = sealer.seal("alice", secret_id, raw)

    assert raw.encode() not in sealed and base64.b64decode(raw.removeprefix("whsec_")) not in sealed
    assert sealer.open("alice", secret_id, sealed) == raw
    for tenant, other_id, key in (
        ("bob", secret_id, KEY),
        ("alice", uuid.uuid4(), KEY),
        ("alice", secret_id, OTHER_KEY),
    ):
        with pytest.raises(webhook_secrets.Unreadable):
            webhook_secrets.Sealer.of(key).open(tenant, other_id, sealed)


def test_a_new_secret_is_whsec_and_32_random_bytes():
    first, second = webhook_secrets.new_secret(), webhook_secrets.new_secret()

    assert first.startswith("whsec_") and first != second
    assert len(base64.b64decode(first.removeprefix("whsec_"))) == 32


def test_a_notice_signed_during_a_rotation_verifies_with_either_secret_and_no_other():
    old, new, other = (webhook_secrets.new_secret() for _ in range(3))
    timestamp = int(time.time())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(timestamp)}
    headers["webhook-signature"] = webhook_sender.signatures([new, old], "msg_1", timestamp, BODY)

    assert len(headers["webhook-signature"].split(" ")) == 2
    assert Webhook(old).verify(BODY, headers)["data"]["tenant"] == "bob"
    assert Webhook(new).verify(BODY, headers)["data"]["tenant"] == "bob"
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(BODY, headers)


@pytest.mark.parametrize("value", ["short", base64.b64encode(b"x" * 16).decode(), "not base64!" * 4])
def test_the_sealing_key_must_be_the_base64_of_32_bytes(value):
    with pytest.raises(ValueError, match="32 bytes"):
        settings.ApiSettings(webhook_secrets_key=value)


def test_notices_need_the_sealing_key_and_with_it_a_callback_url_is_accepted():
    url = "https://hooks.example.com/castad"

    assert "CASTAD_API_WEBHOOK_SECRETS_KEY" in (webhooks.refusal(url, settings.ApiSettings()) or "")
    assert webhooks.refusal(url, settings.ApiSettings(webhook_secrets_key=KEY)) is None
