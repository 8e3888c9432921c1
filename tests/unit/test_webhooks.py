"""Notices of a pipeline's end.

Signed as Standard Webhooks (checked by that project's own library), and never sent to a private, loopback or
link-local address unless allowed.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import threading
import time
from collections.abc import Iterator
from http import server

import httpx
import pytest
from castad_api import creation, settings, webhook_sender, webhooks
from castad_contracts import api, brief
from castad_runtime import outbound
from standardwebhooks import Webhook

SECRET = "whsec_" + base64.b64encode(b"castad webhook test key").decode()
PUBLIC = "93.184.216.34"  # a literal public address: no DNS involved


def config(**values) -> settings.ApiSettings:
    return settings.ApiSettings(**{"webhook_secret": SECRET, **values})


def test_a_signature_is_what_the_standard_webhooks_library_verifies():
    body = b'{"type":"pipeline.succeeded","data":{"id":"p"}}'
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(int(time.time()))}
    headers["webhook-signature"] = webhook_sender.sign(SECRET, "msg_1", int(headers["webhook-timestamp"]), body)

    assert Webhook(SECRET).verify(body, headers) == {"type": "pipeline.succeeded", "data": {"id": "p"}}
    with pytest.raises(Exception, match="signature"):
        Webhook(SECRET).verify(body + b" ", headers)


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1:9000/hook",
        "https://10.1.2.3/hook",
        "https://192.168.0.10/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://100.64.0.1/hook",
        "https://[::1]/hook",
        "https://[fc00::1]/hook",
        "https://[::ffff:10.0.0.1]/hook",
        "https://0.0.0.0/hook",
        "https://localhost:8080/hook",
        "https://api.localhost/hook",
        "http://127.0.0.1:9000/hook",
    ],
)
def test_a_private_destination_is_refused_at_submit_and_at_delivery(url):
    assert webhooks.refusal(url, config()) is not None
    assert webhooks.refusal(url, config(webhook_allow_private=True)) is None
    sender = webhook_sender.Sender(False, 5)
    outcome = sender.send("d-0", url, b"{}", [SECRET])
    sender.close()
    assert outcome.blocked and outcome.error == webhook_sender.REFUSED


def test_a_public_address_or_a_name_is_accepted_and_nothing_without_a_secret():
    assert webhooks.refusal(f"https://{PUBLIC}/hook", config()) is None
    assert webhooks.refusal("https://hooks.example.com/castad", config()) is None  # checked once resolved
    assert "CASTAD_API_WEBHOOK_SECRET" in webhooks.refusal("https://hooks.example.com/x", settings.ApiSettings())
    assert outbound.addresses(PUBLIC, 443, allow_private=False) == [ipaddress.ip_address(PUBLIC)]


def test_plain_http_is_refused_unless_private_destinations_are_allowed():
    assert "https" in (webhooks.refusal(f"http://{PUBLIC}/hook", config()) or "")
    assert webhooks.refusal(f"http://{PUBLIC}/hook", config(webhook_allow_private=True)) is None


def test_the_request_goes_to_its_url_with_signed_headers():
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    sender = webhook_sender.Sender(False, 5, transport=httpx.MockTransport(answer))
    outcome = sender.send("d-1", f"https://{PUBLIC}:8080/hook?x=1", b"{}", [SECRET])

    assert outcome.delivered and outcome.status_code == 204
    [request] = seen
    assert (request.url.host, request.url.port, request.url.path) == (PUBLIC, 8080, "/hook")
    assert request.headers["host"] == f"{PUBLIC}:8080" and request.headers["webhook-id"] == "d-1"
    assert Webhook(SECRET).verify(b"{}", dict(request.headers)) == {}


def test_a_redirect_is_a_failed_try_never_followed():
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(307, headers={"location": "http://169.254.169.254/latest"})

    sender = webhook_sender.Sender(False, 5, transport=httpx.MockTransport(answer))
    outcome = sender.send("d-2", f"https://{PUBLIC}/first", b"{}", [SECRET])

    assert (outcome.delivered, outcome.blocked, outcome.status_code) == (False, False, 307)
    assert len(seen) == 1 and "not followed" in (outcome.error or "")


@pytest.mark.parametrize(
    "address", ["64:ff9b::a00:1", "2002:7f00:1::", "::7f00:1", "::ffff:0:a00:1", "64:ff9b:1::a00:1", "fec0::1"]
)
def test_an_ipv6_address_carrying_a_private_ipv4_one_is_not_public(address):
    with pytest.raises(outbound.Refused):
        outbound.addresses(address, 443, allow_private=False)


def test_a_receiver_trickling_its_answer_cannot_hold_the_sender_past_its_time():
    class Trickle(httpx.SyncByteStream):
        def __iter__(self):
            for _ in range(100):
                time.sleep(0.05)
                yield b"x"

    sender = webhook_sender.Sender(
        False, 0.5, transport=httpx.MockTransport(lambda r: httpx.Response(200, stream=Trickle()))
    )
    started = time.monotonic()
    outcome = sender.send("d-3", f"https://{PUBLIC}/slow", b"{}", [SECRET])

    assert not outcome.delivered and "ReadTimeout" in (outcome.error or "")
    assert time.monotonic() - started < 2


def test_a_url_no_try_can_send_to_fails_the_notice_at_once():
    sender = webhook_sender.Sender(False, 5, transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    assert sender.send("d-4", "https://example.com:99999/x", b"{}", [SECRET]).blocked


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "https://user:pw@example.com/x", "not a url", "/relative", "http://h:99999/x"]
)
def test_a_callback_url_must_be_an_absolute_http_url_without_credentials(url):
    with pytest.raises(ValueError, match="callback_url"):
        api.PipelineRequest(customer_name="a", region="b", callback_url=url)


@pytest.mark.parametrize("secret", ["hunter2", "whsec_" + "A" * 22, "whsec_c2hvcnQ="])
def test_a_secret_that_is_not_whsec_and_16_bytes_of_base64_is_refused(secret):
    with pytest.raises(ValueError, match="whsec_"):
        settings.ApiSettings(webhook_secret=secret)


class Receiver(server.ThreadingHTTPServer):
    """A webhook receiver on 127.0.0.1 that records the Host header of what it gets."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Receive)
        self.hosts: list[str] = []


class _Receive(server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.hosts.append(self.headers["host"])
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()
    thread.join()


def test_a_name_is_sent_to_the_address_it_was_checked_at_with_its_own_host_header(receiver, monkeypatch):
    port = receiver.server_address[1]
    looked_up: list[str] = []

    def lookup(host: str, port: int) -> list:
        looked_up.append(host)  # the one name server: nothing else resolves receiver.test
        return [(2, 1, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(outbound, "_lookup", lookup)
    sender = webhook_sender.Sender(True, 5)
    assert sender.send("d-5", f"http://receiver.test:{port}/hook", b"{}", [SECRET]).delivered
    sender.close()

    assert looked_up == ["receiver.test"] and receiver.hosts == [f"receiver.test:{port}"]


def test_a_try_longer_than_its_deadline_is_a_failed_try_and_the_deliverer_goes_on():
    def slow(request: httpx.Request) -> httpx.Response:
        time.sleep(2)
        return httpx.Response(200)

    sender = webhook_sender.Sender(False, 5, transport=httpx.MockTransport(slow))
    sender.deadline_s = 0.3
    started = time.monotonic()
    outcome = sender.send("d-6", f"https://{PUBLIC}/hook", b"{}", [SECRET])

    assert not outcome.delivered and "no answer within 0.3 s" in (outcome.error or "")
    assert time.monotonic() - started < 1.5


def test_a_replay_without_a_callback_url_hashes_as_the_brief_alone_did():
    fields = {"customer_name": "머뭄", "region": "군산"}
    brief_alone = json.dumps(brief.Brief(**fields).model_dump(mode="json"), sort_keys=True, ensure_ascii=False)

    assert creation.request_hash(api.PipelineRequest(**fields)) == hashlib.sha256(brief_alone.encode()).hexdigest()
    with_callback = api.PipelineRequest(**fields, callback_url="https://example.com/x")
    assert creation.request_hash(with_callback) != creation.request_hash(api.PipelineRequest(**fields))
