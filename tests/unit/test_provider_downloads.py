"""A provider's result URL is the provider's word, not ours: it is fetched through the guarded client.

An answer naming the cloud's metadata service, this machine or a host inside the cluster is never
fetched, directly or by a redirect, and what a tenant reads of a failed download is a public code
and message: never the body of what came back (operators find it in the logs)."""

from __future__ import annotations

import gzip
import pathlib
import threading
from collections.abc import Iterator
from http import server

import httpx
import pytest
from castad_runtime.stage import cancellation, errors, http

AUDIO = b"ID3" + b"\x00" * 2000


class Inside(server.ThreadingHTTPServer):
    """A server on 127.0.0.1 standing for what must not be reached (metadata, a service in the cluster)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Secret)
        self.hits = 0

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Secret(server.BaseHTTPRequestHandler):
    server: Inside

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.hits += 1
        secret = b'{"message": "AccessKeyId=ASIAINSIDE SecretAccessKey=inside-secret-123"}'
        body = AUDIO if self.path.endswith(".mp3") else secret
        self.send_response(200 if self.path.endswith(".mp3") else 403)
        self.send_header("content-type", "audio/mpeg" if self.path.endswith(".mp3") else "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        pass


@pytest.fixture
def inside() -> Iterator[Inside]:
    server = Inside()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def fetch(url: str, dest: pathlib.Path, transport: httpx.BaseTransport | None = None, **options) -> http.Download:
    options.setdefault("media_types", ("audio/",))
    return http.download(
        url,
        dest,
        cancellation.Cancellation(),
        max_bytes=100_000,
        timeout_s=5,
        transport=transport,
        **options,
    )


@pytest.mark.parametrize(
    "where",
    [
        "http://127.0.0.1:{port}/song.mp3",
        "https://127.0.0.1:{port}/song.mp3",
        "http://localhost:{port}/song.mp3",
        "https://[::ffff:127.0.0.1]:{port}/song.mp3",
        "https://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "https://10.0.0.7/internal",
        "https://[fd00::1]/internal",
    ],
)
def test_a_result_at_a_private_address_is_never_fetched(inside, tmp_path, where):
    with pytest.raises(errors.ProviderError) as refused:
        fetch(where.format(port=inside.port), tmp_path / "song.mp3")

    assert (refused.value.code, refused.value.retryable) == ("provider_url_refused", False)
    assert inside.hits == 0 and not (tmp_path / "song.mp3").exists()


def test_a_name_that_resolves_inside_is_refused_before_any_connection(inside, tmp_path, monkeypatch):
    from castad_runtime import outbound

    monkeypatch.setattr(outbound, "_lookup", lambda host, port: [(2, 1, 6, "", ("127.0.0.1", port))])

    with pytest.raises(errors.ProviderError) as refused:
        fetch(f"https://cdn.example.com:{inside.port}/song.mp3", tmp_path / "song.mp3")

    assert refused.value.code == "provider_url_refused" and inside.hits == 0


def test_a_redirect_inside_is_not_followed():
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        if request.url.host == "cdn.example.com":
            return httpx.Response(302, headers={"location": "http://169.254.169.254/latest/meta-data/"})
        return httpx.Response(200, content=AUDIO, headers={"content-type": "audio/mpeg"})

    with pytest.raises(errors.ProviderError) as refused:
        fetch("https://cdn.example.com/song.mp3", pathlib.Path("/nonexistent/song.mp3"), httpx.MockTransport(answer))

    assert refused.value.code == "provider_url_refused"
    assert seen == ["https://cdn.example.com/song.mp3"]


def test_a_public_redirect_is_followed_without_the_first_hosts_headers(tmp_path):
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.host == "cdn.example.com":
            return httpx.Response(307, headers={"location": "https://files.example.net/s/song.mp3"})
        return httpx.Response(200, content=AUDIO, headers={"content-type": "audio/mpeg"})

    got = fetch("https://cdn.example.com/song.mp3", tmp_path / "song.mp3", httpx.MockTransport(answer))

    assert (got.media_type, got.size) == ("audio/mpeg", len(AUDIO))
    assert [r.url.host for r in seen] == ["cdn.example.com", "files.example.net"]
    assert seen[1].headers["host"] == "files.example.net" and "authorization" not in seen[1].headers


def test_what_the_file_host_said_is_for_operators_not_in_the_tenants_message(inside, tmp_path, caplog):
    with pytest.raises(errors.ProviderError) as failed:
        fetch(f"http://127.0.0.1:{inside.port}/expired", tmp_path / "song.mp3", allow_private=True)

    assert failed.value.code == "provider_unavailable" and failed.value.status == 403
    assert "inside-secret" not in failed.value.message and "ASIA" not in failed.value.message
    assert "inside-secret" not in str(failed.value)
    assert "AccessKeyId" in (failed.value.detail or "")  # the operators' detail (logged masked)


def test_a_compressed_answer_is_refused_not_inflated(tmp_path):
    bomb = gzip.compress(b"\x00" * 5_000_000)

    def answer(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "audio/mpeg", "content-encoding": "gzip"}
        return httpx.Response(200, content=bomb, headers=headers)

    with pytest.raises(errors.ProviderError) as refused:
        fetch("https://cdn.example.com/song.mp3", tmp_path / "song.mp3", httpx.MockTransport(answer))

    assert refused.value.code == "provider_artifact_invalid"
    assert not (tmp_path / "song.mp3").exists() or (tmp_path / "song.mp3").stat().st_size == 0


def test_plain_http_is_refused_unless_private_addresses_are_allowed(inside, tmp_path):
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=AUDIO, headers={"content-type": "audio/mpeg"})

    with pytest.raises(errors.ProviderError) as refused:
        fetch("http://cdn.example.com/song.mp3", tmp_path / "a.mp3", httpx.MockTransport(answer))
    assert refused.value.code == "provider_url_refused"

    got = fetch(f"http://127.0.0.1:{inside.port}/song.mp3", tmp_path / "b.mp3", allow_private=True)
    assert got.media_type == "audio/mpeg" and inside.hits == 1


WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 100
MP4 = b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2avc1mp41" + b"\x00" * 100


@pytest.mark.parametrize(
    ("body", "wanted", "found"),
    [(AUDIO, ("audio/",), "audio/mpeg"), (WAV, ("audio/",), "audio/wav"), (MP4, ("video/mp4",), "video/mp4")],
    ids=["mp3", "wav", "mp4"],
)
def test_a_result_is_judged_by_its_bytes_not_by_a_cdns_content_type(tmp_path, caplog, body, wanted, found):
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "application/octet-stream"})

    got = fetch("https://cdn.test/result", tmp_path / "r", httpx.MockTransport(answer), media_types=wanted)

    assert (got.media_type, got.size) == (found, len(body))
    assert "application/octet-stream" in caplog.text  # the header that disagreed is logged


@pytest.mark.parametrize("declared", ["audio/mpeg", "video/mp4"])
def test_a_page_served_as_media_is_refused_by_its_bytes(tmp_path, declared):
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"<!doctype html><h1>Not Found</h1>", headers={"content-type": declared})

    with pytest.raises(errors.ProviderError) as caught:
        fetch("https://cdn.test/result", tmp_path / "r", httpx.MockTransport(answer), media_types=(declared,))
    assert caught.value.code == "provider_artifact_invalid"


def test_audio_is_not_taken_where_a_video_is_wanted(tmp_path):
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=AUDIO, headers={"content-type": "video/mp4"})

    with pytest.raises(errors.ProviderError) as caught:
        fetch("https://cdn.test/result", tmp_path / "r", httpx.MockTransport(answer), media_types=("video/mp4",))
    assert caught.value.code == "provider_artifact_invalid"
