"""The song's score: the melody on the lyrics' syllables, the genre's groove under it, when each line is sung.

The melody moves by each syllable's sound (a bright vowel up, a dark one down), the chorus sung higher and louder;
the key is the seed's, a few semitones either way of D.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np
from castad_contracts import brief, events

from castad_song import g2p, styles, voice

Voice = Literal["lead", "chord", "bass", "kick", "snare", "hat"]
BACKING: frozenset[Voice] = frozenset({"chord", "bass", "kick", "snare", "hat"})

STEPS_PER_BAR = 16
BEATS_PER_BAR = 4


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
    style: styles.Style
    notes: tuple[Note, ...]
    timed_lines: tuple[events.TimedLine, ...]
    phrases: tuple[voice.Phrase, ...] = ()
    bars_s: tuple[float, ...] = ()

    def onsets_per_second(self, voices: frozenset[Voice]) -> float:
        return sum(note.voice in voices for note in self.notes) / self.duration_s


_TONIC = 62  # D4; the seed moves the key a few semitones either way
_KEY_SHIFTS = (-3, -2, -1, 0, 1, 2, 3)
_HANGUL_FIRST, _HANGUL_LAST = 0xAC00, 0xD7A3
_BRIGHT_VOWELS = frozenset({1, 3, 5, 7, 16, 20})  # ㅐ ㅒ ㅔ ㅖ ㅟ ㅣ
_DARK_VOWELS = frozenset({8, 12, 13, 17, 18})  # ㅗ ㅛ ㅜ ㅠ ㅡ


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
    style: styles.Style
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
    style = styles.STYLES[brief.style]
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
