"""Links a provider uses without an API key.

Each stage signs with a key of its own, derived from the gateway's, for one purpose; the lyric stage signs nothing
and holds no key; the gateway checks the signer, the purpose, the path and a lifetime it caps.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
import uuid

import httpx
import pytest
from castad_api import app, settings
from castad_contracts import events
from castad_lyric.service import LyricSettings
from castad_runtime import links
from castad_song.service import SongSettings
from castad_video.service import VideoSettings
from pydantic import SecretStr

from tests.unit.test_console_files import gateway

ROOT = SecretStr("castad-unit-link-root-0123456789abcdef")
SONG, VIDEO = events.Stage.SONG, events.Stage.VIDEO
PIPELINE = "c1d40bf4-431f-4e01-989f-ccea20659509"  # fixed: it names parametrized tests, the same in every xdist worker
CALLBACK = f"/v1/provider-callbacks/song/{PIPELINE}"
SONG_FILE = f"/v1/links/pipelines/{PIPELINE}/artifacts/song"
PHOTO = f"/v1/links/pipelines/{PIPELINE}/photos/0b7e6c52-5f0e-4c83-a4a9-3d2f1f0e8f11"
HOUR = 3600.0


def test_the_derivation_is_rfc_5869s_hkdf():
    """RFC 5869, appendix A, test case 1."""
    okm = links.hkdf(
        bytes.fromhex("0b" * 22),
        salt=bytes.fromhex("000102030405060708090a0b0c"),
        info=bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
        length=42,
    )
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")


def split(url: str) -> tuple[str, int, str]:
    parsed = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parsed.query)
    return parsed.path, int(query["expires"][0]), query["signature"][0]


def accepted(url: str, max_s: float = 6 * HOUR) -> bool:
    return links.accepted(ROOT, *split(url), max_s=max_s)


def test_each_stage_signs_its_own_links_and_no_other_stages():
    song_key, video_key = links.stage_secret(ROOT, SONG), links.stage_secret(ROOT, VIDEO)
    assert song_key.get_secret_value() != video_key.get_secret_value() != ROOT.get_secret_value()

    assert accepted(links.sign("https://gw", CALLBACK, song_key, links.Purpose.CALLBACK, HOUR))
    assert accepted(links.sign("https://gw", SONG_FILE, video_key, links.Purpose.ARTIFACT, HOUR))
    # The video stage's key signs no callback of the song stage, the song's key no file for the render API.
    assert not accepted(links.sign("https://gw", CALLBACK, video_key, links.Purpose.CALLBACK, HOUR))
    assert not accepted(links.sign("https://gw", SONG_FILE, song_key, links.Purpose.ARTIFACT, HOUR))
    # A key signs for one purpose: the song stage's callback signature is no file link's.
    assert not accepted(links.sign("https://gw", SONG_FILE, song_key, links.Purpose.CALLBACK, HOUR))
    # And the root itself signs nothing a stage could.
    assert not accepted(links.sign("https://gw", CALLBACK, ROOT, links.Purpose.CALLBACK, HOUR))


def test_a_photo_link_is_the_video_stages_for_its_photos_and_opens_that_one_image_only():
    video_key = links.stage_secret(ROOT, VIDEO)
    url = links.sign("https://gw", PHOTO, video_key, links.Purpose.PHOTO, HOUR)
    assert accepted(url)
    # Not signed for the song's file purpose, nor by the song stage; nor good for another image or pipeline.
    assert not accepted(links.sign("https://gw", PHOTO, video_key, links.Purpose.ARTIFACT, HOUR))
    assert not accepted(links.sign("https://gw", PHOTO, links.stage_secret(ROOT, SONG), links.Purpose.PHOTO, HOUR))
    assert not accepted(links.sign("https://gw", SONG_FILE, video_key, links.Purpose.PHOTO, HOUR))
    _, expires, signature = split(url)
    other = f"/v1/links/pipelines/{PIPELINE}/photos/{uuid.uuid4()}"
    assert not links.accepted(ROOT, other, expires, signature, max_s=6 * HOUR)
    assert not links.accepted(ROOT, PHOTO.replace(PIPELINE, str(uuid.uuid4())), expires, signature, max_s=6 * HOUR)


@pytest.mark.parametrize(
    "path",
    [
        f"/v1/provider-callbacks/lyric/{PIPELINE}",
        f"/v1/links/pipelines/{PIPELINE}/artifacts/lyrics",
        f"/v1/links/pipelines/{PIPELINE}/artifacts/video",
        f"/v1/links/pipelines/{PIPELINE}/artifacts/lyric",
        f"/v1/links/pipelines/{PIPELINE}/photos",
        f"/v1/links/pipelines/{PIPELINE}/photos/{uuid.uuid4()}/more",
    ],
)
def test_no_key_signs_a_link_nobody_needs(path):
    for stage in events.Stage:
        for purpose in links.Purpose:
            assert not accepted(links.sign("https://gw", path, links.stage_secret(ROOT, stage), purpose, HOUR))


def test_a_link_that_lives_longer_than_the_gateway_allows_is_refused_even_if_well_signed():
    key = links.stage_secret(ROOT, SONG)
    assert accepted(links.sign("https://gw", CALLBACK, key, links.Purpose.CALLBACK, 2 * HOUR), max_s=6 * HOUR)
    assert not accepted(links.sign("https://gw", CALLBACK, key, links.Purpose.CALLBACK, 7 * HOUR), max_s=6 * HOUR)
    expires = 2**40 - 1  # what the gateway's query parameters allowed
    forever = links.signature(key, links.Purpose.CALLBACK, CALLBACK, expires)
    assert not links.accepted(ROOT, CALLBACK, expires, forever, max_s=6 * HOUR)
    assert not accepted(links.sign("https://gw", CALLBACK, key, links.Purpose.CALLBACK, -1))  # expired


def test_the_lyric_stage_holds_no_link_secret_and_the_others_only_their_own(monkeypatch):
    assert "link_secret" not in LyricSettings.model_fields and "gateway_url" not in LyricSettings.model_fields
    assert SongSettings().link_secret is None and VideoSettings().link_secret is None
    monkeypatch.setenv("CASTAD_SONG_LINK_SECRET", links.stage_secret(ROOT, SONG).get_secret_value())
    assert SongSettings().link_secret == links.stage_secret(ROOT, SONG) and VideoSettings().link_secret is None


def test_a_stage_signs_for_no_longer_than_the_gateway_accepts_by_default():
    stage, gateway_settings = SongSettings(), settings.ApiSettings()
    assert stage.provider_give_up_s + links.MARGIN_S <= gateway_settings.link_max_s


def test_the_gateway_answers_401_to_a_link_signed_for_longer_than_it_allows(tmp_path):
    config = settings.ApiSettings(link_secret=ROOT, link_max_s=2 * HOUR)
    gw = gateway(tmp_path)
    gw = type(gw)(config=config, engine=gw.engine, notifications=gw.notifications, store=gw.store)
    url = links.sign("http://gateway", SONG_FILE, links.stage_secret(ROOT, VIDEO), links.Purpose.ARTIFACT, 3 * HOUR)

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app.create_app(gw))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.get(url)

    assert asyncio.run(get()).status_code == 401
    assert time.time() < split(url)[1]  # not expired: refused for its lifetime alone


def test_the_secret_every_service_shared_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("CASTAD_LINK_SECRET", ROOT.get_secret_value())  # what every service read before
    for factory in (settings.ApiSettings, LyricSettings, SongSettings, VideoSettings):
        with pytest.raises(ValueError, match="CASTAD_API_LINK_SECRET"):
            factory()
