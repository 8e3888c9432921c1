"""What every provider of a stage promises its service, checked for each implementation.

The stage services choose a provider by `CASTAD_<STAGE>_PROVIDER`; whichever runs,
the artifact and the values the service puts in its `completed` event must hold.
"""

from __future__ import annotations

import wave

import pytest
from castad_contracts import brief, events
from castad_local.fakes.chat import DEFAULT_KEY, FakeChat
from castad_lyric import chat as lyric_chat
from castad_lyric import instant as lyric_instant
from castad_lyric import provider as lyric_provider
from castad_lyric import service as lyric_service
from castad_runtime.stage import cancellation, errors, http
from castad_song import instant as song_instant
from castad_song import provider as song_provider
from castad_song import service as song_service
from castad_video import instant as video_instant
from castad_video import provider as video_provider
from castad_video import service as video_service
from pydantic import SecretStr, ValidationError

from tests.unit.test_video_provider import probe

BRIEFS = [
    brief.Brief(customer_name="바다책방", region="속초", duration_s=3, orientation=brief.Orientation.VERTICAL),
    brief.Brief(
        customer_name="Cafe Blue",
        region="Busan",
        language=brief.Language.ENGLISH,
        genre=brief.Style.JAZZ.value,
        duration_s=3,
        orientation=brief.Orientation.HORIZONTAL,
    ),
]
LYRIC_PROVIDERS = {
    "local": lyric_provider.LocalLyricProvider,
    "instant": lyric_instant.InstantLyricProvider,
    "openai": lyric_chat.ChatLyricProvider,  # against a local server that behaves like the API
}
SONG_PROVIDERS = {"local": song_provider.LocalSongProvider, "instant": song_instant.InstantSongProvider}
VIDEO_PROVIDERS = {
    "local": lambda: video_provider.LocalVideoProvider(short_side=144, fps=2),
    "instant": video_instant.InstantVideoProvider,
}


@pytest.fixture(scope="module", params=list(VIDEO_PROVIDERS))
def video_renderer(request):
    return VIDEO_PROVIDERS[request.param]()


@pytest.fixture(scope="module")
def chat_client():
    """A client of the fake Chat Completions server, for the `openai` lyric provider."""
    with FakeChat() as fake:
        key = http.Credential(SecretStr(DEFAULT_KEY))
        client = http.HttpProvider("fake", f"{fake.url}/v1", 5, 100_000, key.bearer, allow_private=True)
        yield client
        client.close()


@pytest.mark.parametrize("kind", list(LYRIC_PROVIDERS))
@pytest.mark.parametrize("source", BRIEFS, ids=["korean", "english"])
def test_lyrics_are_in_the_briefs_language_and_name_the_business_and_region(kind, source, chat_client):
    writer = lyric_chat.ChatLyricProvider(chat_client, "m") if kind == "openai" else LYRIC_PROVIDERS[kind]()
    lyrics = writer.write(source, seed="p-1", cancel=cancellation.Cancellation())
    assert lyrics.language is source.language
    text = "\n".join(lyrics.lines())
    assert lyrics.lines() and all(line.strip() for line in lyrics.lines())
    assert source.customer_name in text
    assert source.region in text


@pytest.mark.parametrize("kind", list(SONG_PROVIDERS))
@pytest.mark.parametrize("source", BRIEFS, ids=["korean", "english"])
def test_a_song_is_a_wav_as_long_as_it_says_with_every_line_timed_in_order(kind, source, tmp_path):
    lyrics = lyric_provider.LocalLyricProvider().write(source, seed="p-1")
    out = tmp_path / "song.wav"

    song = SONG_PROVIDERS[kind]().compose(source, lyrics, out, seed="p-1", cancel=cancellation.Cancellation())

    with wave.open(str(out), "rb") as wav:
        assert wav.getnframes() > 0
        assert wav.getnframes() / wav.getframerate() == pytest.approx(song.duration_s, abs=0.01)
    assert [line.text for line in song.timed_lines] == lyrics.lines()
    ends = [0.0]
    for line in song.timed_lines:
        assert ends[-1] <= line.start_s < line.end_s <= song.duration_s + 1e-6
        ends.append(line.end_s)


@pytest.mark.parametrize("source", BRIEFS, ids=["vertical", "horizontal"])
def test_a_video_is_h264_and_aac_in_the_briefs_orientation_as_reported(video_renderer, source, tmp_path):
    lyrics = lyric_provider.LocalLyricProvider().write(source, seed="p-1")
    song_path = tmp_path / "song.wav"
    song = song_provider.LocalSongProvider().compose(
        source, lyrics, song_path, seed="p-1", cancel=cancellation.Cancellation()
    )
    out = tmp_path / "video.mp4"

    video = video_renderer.render(
        source, lyrics, song.timed_lines, song_path, out, seed="p-1", cancel=cancellation.Cancellation()
    )

    found = probe(out)
    assert (found.video_codec, found.audio_codec) == ("h264", "aac")
    assert (found.width, found.height) == (video.width, video.height)
    assert (video.width < video.height) == (source.orientation is brief.Orientation.VERTICAL)
    short, long = sorted((video.width, video.height))
    assert short * 16 == long * 9
    assert found.duration_s == pytest.approx(video.duration_s, abs=0.5)


def test_a_missing_song_is_a_permanent_error_for_every_renderer(video_renderer, tmp_path):
    lyrics = events.Lyrics(title="t", language=brief.Language.KOREAN, sections=())
    with pytest.raises(errors.ProviderError) as raised:
        video_renderer.render(
            BRIEFS[0],
            lyrics,
            (),
            tmp_path / "none.wav",
            tmp_path / "v.mp4",
            seed="p",
            cancel=cancellation.Cancellation(),
        )
    assert not raised.value.retryable


def test_every_provider_kind_is_a_setting_value():
    from castad_runtime.stage import service

    kinds = set(service.StageSettings.model_fields["provider"].annotation.__args__)
    assert kinds == set(SONG_PROVIDERS) == set(VIDEO_PROVIDERS)
    assert set(lyric_service.LyricSettings.model_fields["provider"].annotation.__args__) == set(LYRIC_PROVIDERS)


# Requests a provider publishes it takes in a window (docs/providers.md has the pages): (requests, seconds).
PUBLISHED_LIMITS = {"suno": (20, 10.0), "creatomate": (30, 10.0)}


@pytest.mark.parametrize("provider", list(PUBLISHED_LIMITS))
def test_a_network_providers_default_quota_stays_within_its_published_limit_from_the_first_call(provider, monkeypatch):
    from castad_song.service import SongSettings
    from castad_video.service import VideoSettings

    monkeypatch.setenv("CASTAD_VIDEO_CREATOMATE_TEMPLATE_ID", "tpl")
    monkeypatch.setenv("CASTAD_VIDEO_GATEWAY_URL", "https://gateway.test")
    monkeypatch.setenv("CASTAD_VIDEO_LINK_SECRET", "s" * 32)
    config = SongSettings if provider == "suno" else VideoSettings
    limits = config(provider=provider, **{f"{provider}_api_key": SecretStr("k")}).quota_limits()
    assert limits is not None
    most, window_s = PUBLISHED_LIMITS[provider]
    # A token bucket lets its burst through at once, then its rate: at most this many calls in any window.
    assert limits.burst + limits.max_rate_per_s * window_s <= most


NETWORK_PROVIDERS = [
    (lyric_service.LyricSettings, "openai", {}),
    (song_service.SongSettings, "suno", {}),
    (
        video_service.VideoSettings,
        "creatomate",
        {"creatomate_template_id": "t", "gateway_url": "https://castad.example"},
    ),
]


@pytest.mark.parametrize(("settings_class", "provider", "needs"), NETWORK_PROVIDERS)
def test_a_network_provider_is_refused_without_a_key_and_its_client_is_made_from_the_settings_named_after_it(
    settings_class, provider, needs
):
    prefix = settings_class.model_config["env_prefix"]
    with pytest.raises(ValidationError, match=f"needs {prefix}{provider.upper()}_API_KEY"):
        settings_class(provider=provider, **needs)
    own = {"base_url": "https://api.example.com/v1", "api_key": SecretStr("k"), "timeout_s": 7.5}
    config = settings_class(
        provider=provider, link_secret="s" * 32, **needs, **{f"{provider}_{name}": value for name, value in own.items()}
    )

    client = config.provider_client("the API")
    try:
        assert (client.name, client.timeout_s) == ("the API", 7.5)
        assert client.max_body_bytes == getattr(config, f"{provider}_max_answer_bytes")
    finally:
        client.close()


def test_with_callbacks_the_polls_are_a_safety_net_far_apart_and_without_them_they_keep_their_own_pace():
    from castad_song.service import SongSettings

    key = {"suno_api_key": SecretStr("k")}
    polled = SongSettings(provider="suno", poll_max_s=30.0, **key).poll_schedule()
    called_back = SongSettings(
        provider="suno", poll_max_s=30.0, gateway_url="https://castad.example", link_secret="s" * 32, **key
    ).poll_schedule()

    assert polled.max_s == 30.0 and called_back.max_s == 300.0
    assert called_back.first_s == polled.first_s  # the first poll comes as soon: a callback may be lost
    assert (
        SongSettings(provider="suno", poll_max_s=600.0, gateway_url="https://c.example", link_secret="s" * 32, **key)
        .poll_schedule()
        .max_s
        == 600.0
    )
