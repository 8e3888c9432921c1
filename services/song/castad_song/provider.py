"""Song providers: sing lyrics over a genre's groove and write a WAV.

The local provider arranges the song (castad_song.score), plays it (castad_song.synth), sings the lyrics over it
(castad_song.voice) and mixes the three (castad_song.mix).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Protocol

from castad_contracts import brief, events
from castad_runtime.stage import cancellation

from castad_song import mix, score, synth, voice


class SongProvider(Protocol):
    def compose(
        self,
        brief: brief.Brief,
        lyrics: events.Lyrics,
        out_path: pathlib.Path,
        seed: str,
        *,
        cancel: cancellation.Cancellation,
    ) -> Song: ...


@dataclasses.dataclass(frozen=True)
class Song:
    duration_s: float
    timed_lines: tuple[events.TimedLine, ...]
    bars_s: tuple[float, ...] = ()  # when each bar begins; empty when the song has no steady tempo


class LocalSongProvider:
    """Sings the song offline: melody from the lyrics, groove from the genre, the lyrics sung over it.

    With no voice (`singer=None`) the melody is played on the synth lead alone. A voice that cannot
    sing (eSpeak NG missing) raises voice.VoiceUnavailable here, when the service starts.
    """

    def __init__(self, sample_rate: int = 22050, singer: str | None = "female") -> None:
        self._sample_rate = sample_rate
        self._voice = voice.Voice(voice.SINGERS[singer]) if singer is not None else None

    def compose(
        self,
        brief: brief.Brief,
        lyrics: events.Lyrics,
        out_path: pathlib.Path,
        seed: str,
        *,
        cancel: cancellation.Cancellation,
    ) -> Song:
        arrangement = score.arrange(brief, lyrics, seed)
        rate = self._sample_rate
        backing = synth.render(arrangement, rate, cancel.check, score.BACKING)
        lead = synth.render(arrangement, rate, cancel.check, frozenset({"lead"}))
        sung = None
        if self._voice is not None:
            sung = self._voice.sing(
                arrangement.phrases, lyrics.language, arrangement.duration_s, rate, cancel.check, cancel.run
            )
        samples = mix.master(mix.mix(backing, lead, sung), rate)
        synth.write_wav(out_path, samples, rate)
        return Song(
            duration_s=samples.size / self._sample_rate,
            timed_lines=arrangement.timed_lines,
            bars_s=arrangement.bars_s,
        )
