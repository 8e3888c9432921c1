"""The three network providers as local fakes, and the settings that send every stage to them.

Lyrics from a Chat Completions server, songs from a Suno-shaped music API, videos from Creatomate's render API v2;
the music and render APIs call the gateway back when done.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from castad_contracts import topology
from castad_local.fakes import chat, creatomate, suno
from castad_runtime import links

from tests.support.links import link_secrets

Fakes = tuple[chat.FakeChat, suno.FakeSuno, creatomate.FakeCreatomate]


@contextlib.contextmanager
def fakes(song_s: float, audio_s: float, render_s: float) -> Iterator[Fakes]:
    """The three fakes running: a song takes `song_s` to make and lasts `audio_s`, a render takes `render_s`."""
    with (
        chat.FakeChat() as lyrics,
        suno.FakeSuno(song_s=song_s, audio_s=audio_s) as music,
        creatomate.FakeCreatomate(render_s=render_s) as render,
    ):
        yield lyrics, music, render


def env(running: Fakes, gateway: str, first_poll_s: float) -> dict[str, str]:
    """Every stage on its fake, called back at `gateway` (its port the caller's to set), polled after `first_poll_s`."""
    lyrics, music, render = running
    return {
        **link_secrets(),
        "CASTAD_LYRIC_PROVIDER": "openai",
        "CASTAD_LYRIC_OPENAI_BASE_URL": f"{lyrics.url}/v1",
        "CASTAD_LYRIC_OPENAI_API_KEY": chat.DEFAULT_KEY,
        "CASTAD_SONG_PROVIDER": "suno",
        "CASTAD_SONG_SUNO_BASE_URL": music.url,
        "CASTAD_SONG_SUNO_API_KEY": suno.DEFAULT_KEY,
        "CASTAD_VIDEO_PROVIDER": "creatomate",
        "CASTAD_VIDEO_CREATOMATE_BASE_URL": render.url,
        "CASTAD_VIDEO_CREATOMATE_API_KEY": creatomate.DEFAULT_KEY,
        "CASTAD_VIDEO_CREATOMATE_TEMPLATE_ID": "castad-e2e",
        # The stages whose providers work on their own (a Suno song, a Creatomate render): called back, and polled.
        **{f"CASTAD_{stage.upper()}_GATEWAY_URL": gateway for stage in links.SIGNERS},
        **{f"CASTAD_{stage.upper()}_POLL_FIRST_S": str(first_poll_s) for stage in links.SIGNERS},
        # The fakes listen on 127.0.0.1, over http.
        **{f"CASTAD_{stage.upper()}_ALLOW_PRIVATE": "true" for stage in topology.STAGES},
    }
