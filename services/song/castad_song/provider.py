"""Song providers: sing lyrics over a genre's groove and write a WAV."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import pathlib
import wave
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
from castad_contracts import brief, events
from castad_runtime.stage import cancellation

from castad_song import g2p, mix, voice

Signal = npt.NDArray[np.float64]
Voice = Literal["lead", "chord", "bass", "kick", "snare", "hat"]
BACKING: frozenset[Voice] = frozenset({"chord", "bass", "kick", "snare", "hat"})

STEPS_PER_BAR = 16
BEATS_PER_BAR = 4
CHECK_EVERY_NOTES = 64  # how often synthesis looks whether its attempt was cancelled
_GAINS: dict[Voice, float] = {"lead": 0.5, "chord": 0.11, "bass": 0.3, "kick": 0.55, "snare": 0.28, "hat": 0.09}


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


@dataclasses.dataclass(frozen=True)
class Timbre:
    """Additive synthesis recipe: harmonic amplitudes, exponential decay per second, vibrato."""

    harmonics: tuple[float, ...]
    decay: float = 0.0
    vibrato_semitones: float = 0.0
    vibrato_hz: float = 5.0
    attack_s: float = 0.012
    release_s: float = 0.05


@dataclasses.dataclass(frozen=True)
class Style:
    """How a genre sounds. Patterns are 16 steps per bar, `x` marks a hit."""

    bpm: float
    scale: tuple[int, ...]
    progression: tuple[tuple[int, ...], ...]
    steps_per_beat: int
    swing: float
    kick: str
    snare: str
    hat: str
    bass: str
    chords: str
    lead: Timbre
    pad: Timbre
    walking_bass: bool = False


@dataclasses.dataclass(frozen=True)
class Note:
    voice: Voice
    start_s: float
    duration_s: float
    pitch: float
    velocity: float


@dataclasses.dataclass(frozen=True)
class Arrangement:
    """Everything that is played, and when each lyric line is sung."""

    duration_s: float
    style: Style
    notes: tuple[Note, ...]
    timed_lines: tuple[events.TimedLine, ...]
    phrases: tuple[voice.Phrase, ...] = ()
    bars_s: tuple[float, ...] = ()

    def onsets_per_second(self, voices: frozenset[Voice]) -> float:
        return sum(note.voice in voices for note in self.notes) / self.duration_s


_MAJOR = (0, 2, 4, 5, 7, 9, 11)
_MINOR = (0, 2, 3, 5, 7, 8, 10)
_YONANUKI_MINOR = (0, 2, 3, 7, 8)
_BASS = Timbre((1.0, 0.45, 0.12), decay=1.2, release_s=0.04)
_PAD = Timbre((1.0, 0.3, 0.1), decay=0.5, attack_s=0.04, release_s=0.2)

STYLES: dict[brief.Style, Style] = {
    brief.Style.KPOP: Style(
        bpm=118,
        scale=_MAJOR,
        progression=((0, 4, 7), (7, 11, 14), (9, 12, 16), (5, 9, 12)),
        steps_per_beat=2,
        swing=0.0,
        kick="x...x...x...x...",
        snare="....x.......x...",
        hat="x.x.x.x.x.x.x.x.",
        bass="x.x.x.x.x.x.x.x.",
        chords="x.......x.......",
        lead=Timbre((1.0, 0.45, 0.3, 0.18, 0.1), vibrato_semitones=0.15, vibrato_hz=5.5),
        pad=_PAD,
    ),
    brief.Style.BALLAD: Style(
        bpm=68,
        scale=_MAJOR,
        progression=((0, 4, 7), (9, 12, 16), (5, 9, 12), (7, 11, 14)),
        steps_per_beat=2,
        swing=0.0,
        kick="x.......x.......",
        snare="........x.......",
        hat="x...x...x...x...",
        bass="x.......x.......",
        chords="x...............",
        lead=Timbre((1.0, 0.25, 0.08), vibrato_semitones=0.25, attack_s=0.03, release_s=0.12),
        pad=Timbre((1.0, 0.2, 0.05), decay=0.3, attack_s=0.15, release_s=0.4),
    ),
    brief.Style.HIPHOP: Style(
        bpm=92,
        scale=_MINOR,
        progression=((0, 3, 7), (8, 12, 15), (3, 7, 10), (10, 14, 17)),
        steps_per_beat=4,
        swing=0.0,
        kick="x.....x...x.....",
        snare="....x.......x...",
        hat="xxxxxxxxxxxxxxxx",
        bass="x.....x...x.....",
        chords="x.......x.......",
        lead=Timbre((1.0, 0.0, 0.33, 0.0, 0.2, 0.0, 0.14), decay=2.5, release_s=0.03),
        pad=_PAD,
    ),
    brief.Style.ROCK: Style(
        bpm=132,
        scale=_MAJOR,
        progression=((0, 4, 7), (5, 9, 12), (7, 11, 14), (5, 9, 12)),
        steps_per_beat=2,
        swing=0.0,
        kick="x.x.....x.x.....",
        snare="....x.......x...",
        hat="x.x.x.x.x.x.x.x.",
        bass="x.x.x.x.x.x.x.x.",
        chords="x...x...x...x...",
        lead=Timbre((1.0, 0.7, 0.5, 0.35, 0.25, 0.15), vibrato_semitones=0.2, vibrato_hz=6.0),
        pad=Timbre((1.0, 0.8, 0.6, 0.4, 0.3), decay=1.0),
    ),
    brief.Style.JAZZ: Style(
        bpm=112,
        scale=_MAJOR,
        progression=((2, 5, 9, 12), (7, 11, 14, 17), (0, 4, 7, 11), (9, 12, 16, 19)),
        steps_per_beat=2,
        swing=1 / 3,
        kick="x.......x.......",
        snare="....x.......x...",
        hat="x...x.x.x...x.x.",
        bass="x...x...x...x...",
        chords="x.....x.........",
        lead=Timbre((1.0, 0.5, 0.15, 0.05), vibrato_semitones=0.3, vibrato_hz=4.5),
        pad=Timbre((1.0, 0.2, 0.05, 0.0, 0.0, 0.05), decay=1.5),
        walking_bass=True,
    ),
    brief.Style.TROT: Style(
        bpm=130,
        scale=_YONANUKI_MINOR,
        progression=((0, 3, 7), (5, 8, 12), (7, 11, 14), (0, 3, 7)),
        steps_per_beat=2,
        swing=0.0,
        kick="x.......x.......",
        snare="....x.......x...",
        hat="..x...x...x...x.",
        bass="x...x...x...x...",
        chords="..x...x...x...x.",
        lead=Timbre((1.0, 0.55, 0.3, 0.15), vibrato_semitones=0.6, vibrato_hz=6.5),
        pad=Timbre((1.0, 0.5, 0.25), decay=6.0),
    ),
    brief.Style.ACOUSTIC: Style(
        bpm=96,
        scale=_MAJOR,
        progression=((0, 4, 7), (5, 9, 12), (9, 12, 16), (7, 11, 14)),
        steps_per_beat=2,
        swing=0.0,
        kick="x.......x.......",
        snare="....x.......x...",
        hat="..x...x...x...x.",
        bass="x.......x.......",
        chords="x...x.x...x.x...",
        lead=Timbre((1.0, 0.6, 0.3, 0.15, 0.08), decay=0.8, vibrato_semitones=0.1),
        pad=Timbre((1.0, 0.7, 0.4, 0.25, 0.12), decay=4.0),
    ),
}

_TONIC = 62  # D4; the seed moves the key a few semitones either way
_KEY_SHIFTS = (-3, -2, -1, 0, 1, 2, 3)
_HANGUL_FIRST, _HANGUL_LAST = 0xAC00, 0xD7A3
_BRIGHT_VOWELS = frozenset({1, 3, 5, 7, 16, 20})  # ㅐ ㅒ ㅔ ㅖ ㅟ ㅣ
_DARK_VOWELS = frozenset({8, 12, 13, 17, 18})  # ㅗ ㅛ ㅜ ㅠ ㅡ


def tempo_bpm(style: brief.Style) -> float:
    return STYLES[style].bpm


def syllable_step(syllable: str) -> int:
    """How far the melody moves on this syllable, in scale degrees (-2..2)."""
    code = ord(syllable[0]) - _HANGUL_FIRST
    if 0 <= code <= _HANGUL_LAST - _HANGUL_FIRST:
        initial, vowel, final = code // 588, (code % 588) // 28, code % 28
        lean = 1 if vowel in _BRIGHT_VOWELS else -1 if vowel in _DARK_VOWELS else 0
        return max(-2, min(2, lean + (initial + final) % 3 - 1))
    return sum(ord(char) for char in syllable) % 5 - 2


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def _degree_pitch(degree: int, scale: Sequence[int], tonic: int) -> int:
    octave, index = divmod(degree, len(scale))
    return tonic + 12 * octave + scale[index]


def _nearest_chord_pitch(pitch: int, chord: Sequence[int], tonic: int) -> int:
    candidates = (tonic + tone + 12 * octave for tone in chord for octave in (-2, -1, 0, 1))
    return min(candidates, key=lambda c: (abs(c - pitch), c))


@dataclasses.dataclass(frozen=True)
class _Line:
    text: str
    syllables: tuple[g2p.Syllable, ...]
    chorus: bool


def _lines(lyrics: events.Lyrics) -> list[_Line]:
    return [
        _Line(text, tuple(g2p.syllables(text, lyrics.language)), section.kind == "chorus")
        for section in lyrics.sections
        for text in section.lines
    ]


@dataclasses.dataclass(frozen=True)
class _Grid:
    duration_s: float
    style: Style
    tonic: int

    @property
    def beat_s(self) -> float:
        return 60.0 / self.style.bpm

    @property
    def bar_s(self) -> float:
        return BEATS_PER_BAR * self.beat_s

    def chord_at(self, time_s: float) -> tuple[int, ...]:
        progression = self.style.progression
        return progression[int(time_s // self.bar_s) % len(progression)]

    def swung(self, time_s: float, step_s: float, index: int) -> float:
        return time_s + self.style.swing * step_s if index % 2 else time_s

    def bars(self) -> Iterator[float]:
        start = 0.0
        while start < self.duration_s:
            yield start
            start += self.bar_s


def _slot_bounds(grid: _Grid, lines: Sequence[_Line]) -> list[float]:
    """Start of each line plus the end of the last one; contiguous, snapped to beats when roomy."""
    duration = grid.duration_s
    intro = min(grid.bar_s, 0.1 * duration)
    outro = min(grid.bar_s, 0.06 * duration)
    weights = np.array([len(line.syllables) + 2.0 for line in lines])
    raw = [intro, *(intro + np.cumsum(weights) / weights.sum() * (duration - intro - outro))]
    if (duration - intro - outro) / len(lines) < 2 * grid.beat_s:
        return [float(bound) for bound in raw]
    snapped = [round(bound / grid.beat_s) * grid.beat_s for bound in raw]
    increasing = all(b > a for a, b in zip(snapped, snapped[1:], strict=False))
    return snapped if increasing and snapped[0] > 0 and snapped[-1] <= duration else [float(b) for b in raw]


def _melody(grid: _Grid, line: _Line, start_s: float, end_s: float) -> list[Note]:
    count = len(line.syllables)
    if not count:
        return []
    step_s = grid.beat_s / grid.style.steps_per_beat
    available = int((end_s - start_s) / step_s)
    per_syllable = min((available - 1) // count, 2 * grid.style.steps_per_beat)
    on_grid = per_syllable >= 1
    note_s = per_syllable * step_s if on_grid else 0.92 * (end_s - start_s) / count
    anchor = 5 if line.chorus else 2
    degree = anchor + syllable_step(line.syllables[0].sound)
    velocity = 1.0 if line.chorus else 0.75
    notes: list[Note] = []
    for index, syllable in enumerate(line.syllables):
        degree = max(anchor - 3, min(anchor + 4, degree + syllable_step(syllable.sound)))
        onset = start_s + index * note_s
        if on_grid:
            onset = grid.swung(onset, step_s, index * per_syllable)
        pitch = _degree_pitch(degree, grid.style.scale, grid.tonic)
        length = 0.9 * note_s
        if index == count - 1:
            pitch = _nearest_chord_pitch(pitch, grid.chord_at(onset), grid.tonic)
            length = max(length, min(end_s - onset - step_s, 2 * grid.beat_s))
        notes.append(Note("lead", onset, length, pitch, velocity))
    return notes


def _hits(pattern: str, bar_start: float, grid: _Grid) -> list[float]:
    """Times of a pattern's hits in one bar; off-beat eighths are swung."""
    step_s = grid.bar_s / STEPS_PER_BAR
    swing_s = grid.style.swing * grid.beat_s / 2
    times = (
        bar_start + index * step_s + (swing_s if index % 4 == 2 else 0.0)
        for index, mark in enumerate(pattern)
        if mark == "x"
    )
    return [time for time in times if time < grid.duration_s]


def _accompaniment(grid: _Grid) -> list[Note]:
    style = grid.style
    drums: tuple[tuple[Voice, str], ...] = (("kick", style.kick), ("snare", style.snare), ("hat", style.hat))
    notes: list[Note] = []
    for bar_start in grid.bars():
        chord = grid.chord_at(bar_start)
        for drum, pattern in drums:
            notes.extend(Note(drum, time, 0.0, 0.0, 1.0) for time in _hits(pattern, bar_start, grid))
        notes.extend(_chords(_hits(style.chords, bar_start, grid), bar_start + grid.bar_s, grid, chord))
        notes.extend(_bass(_hits(style.bass, bar_start, grid), bar_start + grid.bar_s, grid, chord))
    return notes


def _lengths(times: Sequence[float], bar_end: float) -> list[float]:
    """Each hit lasts until just before the next one, the last until the bar's end."""
    return [0.92 * (end - start) for start, end in zip(times, [*times[1:], bar_end], strict=True)]


def _chords(times: Sequence[float], bar_end: float, grid: _Grid, chord: Sequence[int]) -> list[Note]:
    return [
        Note("chord", time, length, grid.tonic - 12 + tone, 1.0)
        for time, length in zip(times, _lengths(times, bar_end), strict=True)
        for tone in chord
    ]


def _bass(times: Sequence[float], bar_end: float, grid: _Grid, chord: Sequence[int]) -> list[Note]:
    """Root and fifth in turn, or a walk up the chord tones."""
    notes = []
    for order, (time, length) in enumerate(zip(times, _lengths(times, bar_end), strict=True)):
        tone = chord[order % len(chord)] if grid.style.walking_bass else chord[0 if order % 2 == 0 else -1]
        notes.append(Note("bass", time, length, grid.tonic - 24 + tone - 12 * (tone >= 12), 1.0))
    return notes


def arrange(brief: brief.Brief, lyrics: events.Lyrics, seed: str) -> Arrangement:
    """Lay out the melody, chords, bass and drums of the whole song."""
    style = STYLES[brief.style]
    tonic = _TONIC + _KEY_SHIFTS[_stable_int(seed) % len(_KEY_SHIFTS)]
    grid = _Grid(float(brief.duration_s), style, tonic)
    lines = _lines(lyrics)
    notes = _accompaniment(grid)
    timed: list[events.TimedLine] = []
    phrases: list[voice.Phrase] = []
    if lines:
        bounds = [round(bound, 3) for bound in _slot_bounds(grid, lines)]
        for line, start, end in zip(lines, bounds, bounds[1:], strict=False):
            melody = _melody(grid, line, start, end)
            notes.extend(melody)
            timed.append(_timed(line, melody, start, end))
            sung = tuple(voice.SungNote(note.start_s, note.duration_s, note.pitch) for note in melody)
            phrases.append(voice.Phrase(line.syllables, sung))
    bars = tuple(round(start, 3) for start in grid.bars())
    return Arrangement(grid.duration_s, style, tuple(notes), tuple(timed), tuple(phrases), bars)


def _timed(line: _Line, melody: Sequence[Note], slot_start: float, slot_end: float) -> events.TimedLine:
    """When the line is sung: from its first note to the end of its last, each syllable on its note."""
    if not melody:
        return events.TimedLine(text=line.text, start_s=slot_start, end_s=slot_end)
    ends = [later.start_s for later in melody[1:]] + [melody[-1].start_s + melody[-1].duration_s]
    sung = tuple(
        events.TimedSyllable(text=syllable.text, at=syllable.at, start_s=round(note.start_s, 3), end_s=round(end, 3))
        for syllable, note, end in zip(line.syllables, melody, ends, strict=True)
    )
    return events.TimedLine(text=line.text, start_s=sung[0].start_s, end_s=sung[-1].end_s, syllables=sung)


def _envelope(count: int, sample_rate: int, timbre: Timbre) -> Signal:
    envelope = np.ones(count)
    attack = min(int(timbre.attack_s * sample_rate), count // 2)
    release = min(int(timbre.release_s * sample_rate), count // 2)
    if attack:
        envelope[:attack] = np.linspace(0.0, 1.0, attack)
    if release:
        envelope[-release:] *= np.linspace(1.0, 0.0, release)
    return envelope


def _tone(pitch: float, count: int, sample_rate: int, timbre: Timbre) -> Signal:
    t = np.arange(count) / sample_rate
    freq = 440.0 * 2.0 ** ((pitch - 69.0) / 12.0)
    warp = t
    if timbre.vibrato_semitones:
        depth = 2.0 ** (timbre.vibrato_semitones / 12.0) - 1.0
        rate = 2 * math.pi * timbre.vibrato_hz
        warp = t + depth * (1.0 - np.cos(rate * t)) / rate * np.minimum(t / 0.3, 1.0)
    phase = 2 * math.pi * freq * warp
    audible = [a for number, a in enumerate(timbre.harmonics, start=1) if number * freq < sample_rate / 2]
    signal = _harmonic_sum(phase, audible)
    if timbre.decay:
        signal *= np.exp(-timbre.decay * t)
    return signal * _envelope(count, sample_rate, timbre) / sum(timbre.harmonics)


def _harmonic_sum(phase: Signal, amplitudes: Sequence[float]) -> Signal:
    """Sum of a_k * sin(k * phase), by the Chebyshev recurrence: one sin and one cos in all."""
    previous, current = np.zeros_like(phase), np.sin(phase)
    twice_cos = 2.0 * np.cos(phase)
    signal = np.zeros_like(phase)
    for amplitude in amplitudes:
        if amplitude:
            signal += amplitude * current
        previous, current = current, twice_cos * current - previous
    return signal


def _drums(sample_rate: int) -> dict[Voice, Signal]:
    noise = np.random.default_rng(0).uniform(-1.0, 1.0, int(0.25 * sample_rate))
    t = np.arange(noise.size) / sample_rate
    sweep = 2 * math.pi * np.cumsum(45.0 + 90.0 * np.exp(-30.0 * t)) / sample_rate
    kick = np.sin(sweep) * np.exp(-12.0 * t)
    snare = 0.7 * noise * np.exp(-25.0 * t) + 0.4 * np.sin(2 * math.pi * 190.0 * t) * np.exp(-30.0 * t)
    hat = np.diff(noise, prepend=0.0) * np.exp(-80.0 * t)
    return {"kick": kick, "snare": snare, "hat": hat}


def _add(buffer: Signal, signal: Signal, start_s: float, sample_rate: int) -> None:
    start = int(round(start_s * sample_rate))
    end = min(start + signal.size, buffer.size)
    if 0 <= start < end:
        buffer[start:end] += signal[: end - start]


def render(
    arrangement: Arrangement,
    sample_rate: int,
    check: Callable[[], None] = lambda: None,
    voices: frozenset[Voice] = frozenset(_GAINS),
) -> Signal:
    """Synthesize the arrangement's notes of `voices`, unmastered.

    `check` is called between notes (it raises to stop the work).
    """
    buffer = np.zeros(int(round(arrangement.duration_s * sample_rate)))
    drums = _drums(sample_rate)
    timbres: dict[Voice, Timbre] = {"lead": arrangement.style.lead, "chord": arrangement.style.pad, "bass": _BASS}
    tones: dict[tuple[Voice, float, int], Signal] = {}
    for index, note in enumerate(arrangement.notes):
        if index % CHECK_EVERY_NOTES == 0:
            check()
        if note.voice not in voices:
            continue
        gain = _GAINS[note.voice] * note.velocity
        if note.voice in drums:
            _add(buffer, gain * drums[note.voice], note.start_s, sample_rate)
            continue
        key = (note.voice, note.pitch, max(int(note.duration_s * sample_rate), 1))
        if key not in tones:
            tones[key] = _tone(note.pitch, key[2], sample_rate, timbres[note.voice])
        _add(buffer, gain * tones[key], note.start_s, sample_rate)
    return buffer


def write_wav(path: pathlib.Path, samples: Signal, sample_rate: int) -> None:
    pcm = np.clip(np.round(samples * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.tobytes())


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
        arrangement = arrange(brief, lyrics, seed)
        rate = self._sample_rate
        backing = render(arrangement, rate, cancel.check, BACKING)
        lead = render(arrangement, rate, cancel.check, frozenset({"lead"}))
        sung = None
        if self._voice is not None:
            sung = self._voice.sing(
                arrangement.phrases, lyrics.language, arrangement.duration_s, rate, cancel.check, cancel.run
            )
        samples = mix.master(mix.mix(backing, lead, sung), rate)
        write_wav(out_path, samples, rate)
        return Song(
            duration_s=samples.size / self._sample_rate,
            timed_lines=arrangement.timed_lines,
            bars_s=arrangement.bars_s,
        )
