"""The instant song provider: a short silent WAV at once, so benchmarks measure everything around it."""

from __future__ import annotations

import pathlib
import wave

from castad_contracts import brief, events
from castad_runtime.stage import cancellation

from castad_song import provider

SAMPLE_RATE = 8000
DURATION_S = 0.25


class InstantSongProvider:
    """A quarter of a second of silence (mono, 16 bit), the lyric lines spread evenly over it."""

    def compose(
        self,
        brief: brief.Brief,
        lyrics: events.Lyrics,
        out_path: pathlib.Path,
        seed: str,
        *,
        cancel: cancellation.Cancellation,
    ) -> provider.Song:
        frames = int(SAMPLE_RATE * DURATION_S)
        with wave.open(str(out_path), "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(SAMPLE_RATE)
            out.writeframes(b"\0\0" * frames)
        lines = lyrics.lines() or [lyrics.title]
        step = DURATION_S / len(lines)
        timed = tuple(
            events.TimedLine(text=text, start_s=round(i * step, 6), end_s=round((i + 1) * step, 6))
            for i, text in enumerate(lines)
        )
        return provider.Song(duration_s=frames / SAMPLE_RATE, timed_lines=timed)
