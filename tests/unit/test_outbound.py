"""The guarded client every outbound call goes through.

Which destinations it refuses, how it follows redirects, and what it takes of an answer.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import httpx
import pytest
from castad_runtime import outbound
from castad_runtime.stage import cancellation, errors, http

PUBLIC = "93.184.216.34"


def mock(answer) -> outbound.Client:
    return outbound.Client(allow_private=False, timeout_s=5, transport=httpx.MockTransport(answer))


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://example.com/x", "https"),
        ("ftp://example.com/x", "https"),
        ("https://user:pw@example.com/x", "credentials"),
        ("https://example.com:99999/x", "port"),
        ("https://localhost/x", "this machine"),
        ("https://127.0.0.2/x", "public"),
        ("https://[::ffff:169.254.169.254]/x", "public"),
        ("https://224.0.0.1/x", "public"),
        ("https://240.0.0.1/x", "public"),
        ("/relative", "https"),
    ],
)
def test_a_url_that_is_not_an_https_one_of_a_public_host_is_refused_before_any_lookup(url, why):
    with pytest.raises(outbound.Refused, match=why):
        outbound.check_url(url, allow_private=False)


def test_allowing_private_destinations_lets_plain_http_and_this_machine_through():
    assert outbound.check_url("http://127.0.0.1:8080/x", allow_private=True).port == 8080
    with pytest.raises(outbound.Refused):
        outbound.check_url("https://user:pw@127.0.0.1/x", allow_private=True)


def test_a_name_with_one_private_address_among_public_ones_is_refused(monkeypatch):
    answers = [(2, 1, 6, "", (PUBLIC, 443)), (2, 1, 6, "", ("10.0.0.9", 443))]
    monkeypatch.setattr(outbound, "_lookup", lambda host, port: answers)

    with pytest.raises(outbound.Refused, match="10.0.0.9"):
        outbound.addresses("rebind.example.com", 443, allow_private=False)
    assert outbound.addresses("rebind.example.com", 443, allow_private=True) == [
        ipaddress.ip_address(PUBLIC),
        ipaddress.ip_address("10.0.0.9"),
    ]


def test_a_name_is_looked_up_once_and_what_it_said_is_checked_before_any_connection(monkeypatch):
    """The lookup that is checked is the one connected by: a second answer (a rebind) is never asked for."""
    lookups: list[str] = []

    def lookup(host: str, port: int) -> list:
        lookups.append(host)
        return [(2, 1, 6, "", ("169.254.169.254", port))] if len(lookups) > 1 else [(2, 1, 6, "", ("192.0.2.1", port))]

    monkeypatch.setattr(outbound, "_lookup", lookup)
    client = outbound.Client(allow_private=False, timeout_s=0.5)
    with pytest.raises(outbound.Refused), client.stream("GET", "https://rebind.example.com/x"):
        pass
    client.close()

    assert lookups == ["rebind.example.com"]  # 192.0.2.1 (TEST-NET, not public) refused; nothing connected


def test_a_get_follows_at_most_its_redirects_never_down_to_http():
    def answer(request: httpx.Request) -> httpx.Response:
        hop = int(request.url.path.strip("/") or 0)
        if request.url.host == "down.example.com":
            return httpx.Response(302, headers={"location": "http://plain.example.com/"})
        return httpx.Response(302, headers={"location": f"/{hop + 1}"})

    client = mock(answer)
    with pytest.raises(outbound.TooManyRedirects), client.stream("GET", "https://example.com/0", max_redirects=3):
        pass
    with (
        pytest.raises(outbound.Refused, match="down to http"),
        client.stream("GET", "https://down.example.com/", max_redirects=3),
    ):
        pass
    with client.stream("GET", "https://example.com/0") as response:  # none allowed: the 3xx itself
        assert response.status_code == 302


def test_a_redirect_keeps_the_callers_headers_only_on_the_same_origin():
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/a":
            return httpx.Response(302, headers={"location": "/b"})
        if request.url.path == "/b":
            return httpx.Response(302, headers={"location": "https://other.example.net/c"})
        return httpx.Response(200, content=b"ok")

    client = mock(answer)
    with client.stream("GET", "https://example.com/a", max_redirects=3, headers={"authorization": "Bearer k"}) as r:
        assert outbound.read(r, 100, time.monotonic() + 5) == b"ok"

    assert [("authorization" in r.headers) for r in seen] == [True, True, False]


def test_an_answer_is_read_up_to_its_cap_and_only_as_identity():
    client = mock(lambda request: httpx.Response(200, content=b"x" * 101))
    with client.stream("GET", "https://example.com/") as response, pytest.raises(outbound.TooLarge):
        outbound.read(response, 100, time.monotonic() + 5)

    encoded = mock(lambda request: httpx.Response(200, content=b"x", headers={"content-encoding": "br"}))
    with encoded.stream("GET", "https://example.com/") as response, pytest.raises(outbound.EncodingRefused):
        outbound.read(response, 100, time.monotonic() + 5)

    asked: list[str] = []
    plain = mock(lambda request: asked.append(request.headers["accept-encoding"]) or httpx.Response(204))
    with plain.stream("GET", "https://example.com/"):
        pass
    assert asked == ["identity"]


def test_a_provider_api_at_a_private_address_is_refused_unless_allowed():
    with pytest.raises(outbound.Refused):
        http.HttpProvider("the music API", "http://127.0.0.1:9/", 1.0, 1000)

    api = http.HttpProvider("the music API", "https://api.example.com", 1.0, 1000, allow_private=False)
    api._client = outbound.Client(
        allow_private=False,
        timeout_s=1,
        base_url="https://api.example.com",
        transport=httpx.MockTransport(lambda r: httpx.Response(302, headers={"location": "https://10.0.0.1/"})),
    )
    with pytest.raises(errors.ProviderError) as redirected:
        api.json("GET", "v1/x", cancellation.Cancellation())
    assert redirected.value.code == "provider_rejected"  # an API's redirect is never followed


def test_a_provider_apis_own_words_are_its_errors_detail_not_its_message():
    body = b'{"error": {"message": "Incorrect API key provided: sk-proj-abcd1234. Internal host db-7.svc"}}'
    error = http.classify("the LLM", 401, httpx.Headers(), body)

    assert (error.code, error.message) == ("provider_auth", "the LLM answered 401")
    assert "db-7.svc" in (error.detail or "") and "sk-proj-abcd1234" not in (error.detail or "")


def test_a_server_that_drips_its_answers_headers_is_left_at_the_deadline_of_the_whole_exchange():
    """Each byte comes well within the client's timeout, so only a deadline for the whole exchange ends it."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"x" * 200:  # 0.1 s a byte: 20 s of headers
                if stop.wait(0.1):
                    return
                conn.sendall(bytes([byte]))

    threading.Thread(target=drip, daemon=True).start()
    client = outbound.Client(allow_private=True, timeout_s=1.0)
    started = time.monotonic()
    try:
        with (
            pytest.raises(httpx.TimeoutException),
            client.stream("GET", f"http://127.0.0.1:{server.getsockname()[1]}/", deadline=started + 1.0),
        ):
            pass
    finally:
        stop.set()
        client.close()
        server.close()

    assert time.monotonic() - started < 5  # at its deadline, not after the server's 20 s
