"""Sing the lyrics on the melody's notes: eSpeak NG speaks each line, WORLD makes it sing.

Each line (a phrase) is spoken once, whole, so its consonants and vowels run into each other as
in speech. Its vowels are found from eSpeak's phoneme times and matched to the line's notes; the
WORLD vocoder (pyworld) then re-times the phrase, holding each vowel for its note while keeping the
consonants about as short as spoken (placed just before the note, so the vowel lands on the beat),
and sings it on a pitch contour made of the notes, short glides between them and vibrato on long
ones. Breaths (shaped noise) fill the rests between phrases.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pyworld
from castad_contracts import brief

from castad_song import espeak, g2p

Signal = npt.NDArray[np.float64]

FRAME_S = 0.005
LANGUAGES: dict[brief.Language, str] = {
    brief.Language.KOREAN: "ko",
    brief.Language.ENGLISH: "en-us",
    brief.Language.JAPANESE: "ja",
    brief.Language.CHINESE: "cmn",
}
_VOWEL_STARTS = frozenset("aeiouyAEIOUVY@0&3")
# Consonants always sung on pitch (nasals, liquids, glides); the others where eSpeak voiced them.
_SONORANT_STARTS = frozenset("mnNlrRjw*L")
APERIODICITY_POWER = 1.5
EDGE_S = 0.03  # the start and end of a vowel, where it moves from and to its consonants, keep their speed
LEAD_MAX_S = 0.12  # longest a phrase's first consonants may start before its first note
CONSONANT_SHARE = 0.4  # consonants between two vowels take at most this share of the note before
TAIL_MAX_S = 0.15
GLIDE_BEFORE_S, GLIDE_AFTER_S = 0.012, 0.012  # the pitch moves to a note as its vowel begins
VIBRATO_MIN_NOTE_S = 0.4
VIBRATO_DELAY_S = 0.18
VIBRATO_RAMP_S = 0.25
VIBRATO_SEMITONES = 0.3
VIBRATO_HZ = 5.5
DRIFT_CENTS = 6.0
PHRASE_FADE_S = 0.06
BREATH_MIN_REST_S = 0.45
BREATH_S = 0.32
BREATH_LEVEL = 0.07  # of the voice's RMS


class VoiceUnavailable(RuntimeError):
    """The singing voice cannot sing (eSpeak NG or one of its languages is missing)."""


@dataclasses.dataclass(frozen=True)
class Singer:
    """Who sings: an eSpeak NG voice variant and how far from the written melody it sings."""

    name: str
    variant: str
    transpose: int = 0


SINGERS = {
    "female": Singer("female", "f3"),
    "male": Singer("male", "m3", transpose=-12),
}


@dataclasses.dataclass(frozen=True)
class SungNote:
    start_s: float
    duration_s: float
    pitch: float


@dataclasses.dataclass(frozen=True)
class Phrase:
    """A lyric line to sing: its syllables and the notes of the melody they are sung on, one each."""

    syllables: tuple[g2p.Syllable, ...]
    notes: tuple[SungNote, ...]


@dataclasses.dataclass(frozen=True)
class _Group:
    """Vowels of the spoken phrase sung over a run of notes (one vowel per note when counts match)."""

    in_start: float
    in_end: float
    first_note: int
    last_note: int


class Voice:
    """A singer who sings every language Castad writes lyrics in, or says at once which it cannot."""

    def __init__(self, singer: Singer) -> None:
        names = {f"{code}+{singer.variant}": language for language, code in LANGUAGES.items()}
        try:
            missing = [names[name].value for name in espeak.missing_voices(list(names))]
        except (espeak.EspeakMissing, espeak.EspeakFailed, OSError, subprocess.SubprocessError) as error:
            raise VoiceUnavailable(f"the {singer.name} voice cannot sing: {error}") from None
        if missing:
            raise VoiceUnavailable(
                f"the {singer.name} voice cannot sing {', '.join(missing)}: install {espeak.PACKAGE}"
            )
        self.singer = singer

    def sing(
        self,
        phrases: Sequence[Phrase],
        language: brief.Language,
        duration_s: float,
        sample_rate: int,
        check: Callable[[], None] = lambda: None,
        run: espeak.Run = espeak.run,
    ) -> Signal:
        """The voice alone, `duration_s` long at `sample_rate`, each phrase on its notes.

        `check` raises to stop the work; `run` runs eSpeak NG's process (the attempt's `cancel.run`).
        """
        sung = [phrase for phrase in phrases if phrase.notes and phrase.syllables]
        name = f"{LANGUAGES[language]}+{self.singer.variant}"
        speeches = espeak.speak([(name, g2p.spelling(list(p.syllables), language)) for p in sung], run)
        rate = speeches[0].sample_rate if speeches else sample_rate
        track = np.zeros(int(round(duration_s * rate)))
        starts: list[tuple[float, float]] = []
        for index, (phrase, speech) in enumerate(zip(sung, speeches, strict=True)):
            check()
            placed = self._phrase(phrase, speech, language, index)
            if placed is None:
                continue
            start_s, samples = placed
            _add(track, samples, start_s, rate)
            starts.append((start_s, start_s + samples.size / rate))
        voiced = track[np.abs(track) > 1e-4]
        level = float(np.sqrt(np.mean(voiced**2))) if voiced.size else 0.0
        if level > 0:
            track /= level  # unit RMS while singing; the mix sets the level
            _breathe(track, starts, rate)
        if sample_rate != rate:
            from scipy import signal  # here: scipy loads once a song is sung, not when the service starts

            track = signal.resample_poly(track, sample_rate, rate)
        return np.asarray(track[: int(round(duration_s * sample_rate))], dtype=np.float64)

    def _phrase(
        self, phrase: Phrase, speech: espeak.Speech, language: brief.Language, index: int
    ) -> tuple[float, Signal] | None:
        segments = _segments(speech, merge_vowels=language is brief.Language.CHINESE)
        nuclei = [(start, end) for kind, start, end in segments if kind == "V"]
        if not nuclei or speech.samples.size == 0:
            return None
        groups = _groups(nuclei, len(phrase.notes))
        speech_start = next(start for kind, start, _ in segments if kind != "P")
        speech_end = [end for kind, _, end in segments if kind != "P"][-1]
        anchors_out, anchors_in = _anchors(groups, phrase.notes, speech_start, speech_end)
        return self._resynthesize(speech, segments, anchors_out, anchors_in, phrase.notes, index)

    def _resynthesize(
        self,
        speech: espeak.Speech,
        segments: Sequence[tuple[str, float, float]],
        anchors_out: Sequence[float],
        anchors_in: Sequence[float],
        notes: Sequence[SungNote],
        index: int,
    ) -> tuple[float, Signal]:
        rate = speech.sample_rate
        period_ms = FRAME_S * 1000
        f0, times = pyworld.dio(speech.samples, rate, f0_floor=80.0, f0_ceil=700.0, frame_period=period_ms)
        f0 = pyworld.stonemask(speech.samples, f0, times, rate)
        envelope = pyworld.cheaptrick(speech.samples, f0, times, rate)
        aperiodicity = pyworld.d4c(speech.samples, f0, times, rate)
        out_times = np.arange(anchors_out[0], anchors_out[-1], FRAME_S)
        in_times = np.interp(out_times, anchors_out, anchors_in)
        position = np.clip(in_times / FRAME_S, 0, len(f0) - 1)
        low = np.floor(position).astype(int)
        high = np.minimum(low + 1, len(f0) - 1)
        weight = (position - low)[:, None]
        sp = np.ascontiguousarray((1 - weight) * envelope[low] + weight * envelope[high])
        ap = np.ascontiguousarray((1 - weight) * aperiodicity[low] + weight * aperiodicity[high])
        voiced = f0[np.rint(position).astype(int)] > 0
        for kind, start, end in segments:
            if kind in ("V", "S"):
                voiced |= (in_times >= start) & (in_times < end)
        # A vowel eSpeak whispered (Japanese devoices i and u between voiceless consonants) is sung
        # voiced: it takes the phrase's typical aperiodicity instead of its own, which is all noise.
        source_voiced = f0 > 0
        whispered = voiced & ~source_voiced[np.rint(position).astype(int)]
        if source_voiced.any():
            ap[whispered] = np.median(aperiodicity[source_voiced], axis=0)
        # eSpeak's voice analyses as rather breathy; a cleaner source sings clearer and holds its pitch.
        ap[voiced] = ap[voiced] ** APERIODICITY_POWER
        midi = pitch_contour(out_times, notes, seed=index) + self.singer.transpose
        sung_f0 = np.where(voiced, 440.0 * 2.0 ** ((midi - 69.0) / 12.0), 0.0)
        samples = pyworld.synthesize(np.ascontiguousarray(sung_f0), sp, ap, rate, period_ms)
        fade = min(int(PHRASE_FADE_S * rate), samples.size // 2)
        if fade:
            samples[-fade:] *= np.linspace(1.0, 0.0, fade) ** 2
            samples[: fade // 4] *= np.linspace(0.0, 1.0, fade // 4)
        return float(out_times[0]), samples


def _segments(speech: espeak.Speech, merge_vowels: bool) -> list[tuple[str, float, float]]:
    """(kind, start, end) of each phoneme: V a vowel, S a sonorant, C another consonant, P a pause.

    Language switches are dropped.

    With merge_vowels, vowels that follow each other are one (Mandarin finals such as i-a-u are
    one syllable; its syllables are set apart by pauses).
    """
    duration = speech.samples.size / speech.sample_rate
    phonemes = [p for p in speech.phonemes if not p.name.startswith("(")]
    found: list[tuple[str, float, float]] = []
    for phoneme, after in zip(phonemes, [*phonemes[1:], None], strict=True):
        end = after.start_s if after is not None else duration
        first = phoneme.name[0]
        kind = "P" if first == "_" else "V" if first in _VOWEL_STARTS else "S" if first in _SONORANT_STARTS else "C"
        if kind == "V" and phoneme.name.endswith("~"):
            kind = (
                "S"  # a nasalised vowel is how eSpeak says Japanese ン before a vowel or glide: no syllable of its own
            )
        if end <= phoneme.start_s and kind != "P":
            continue
        if merge_vowels and kind == "V" and found and found[-1][0] == "V":
            found[-1] = ("V", found[-1][1], end)
        else:
            found.append((kind, phoneme.start_s, end))
    return found


def _groups(nuclei: Sequence[tuple[float, float]], notes: int) -> list[_Group]:
    """Share the spoken vowels out over the notes: several vowels on one note, or one over several."""
    count = len(nuclei)
    if count >= notes:
        spans = [(g * count // notes, (g + 1) * count // notes) for g in range(notes)]
        return [_Group(nuclei[a][0], nuclei[b - 1][1], g, g) for g, (a, b) in enumerate(spans)]
    return [
        _Group(start, end, j * notes // count, (j + 1) * notes // count - 1) for j, (start, end) in enumerate(nuclei)
    ]


def _anchors(
    groups: Sequence[_Group], notes: Sequence[SungNote], speech_start: float, speech_end: float
) -> tuple[list[float], list[float]]:
    """Points (song time, speech time) of the re-timing, in order: vowels held, consonants kept short."""
    onsets = [notes[group.first_note].start_s for group in groups]
    last = notes[-1]
    ends: list[float] = []
    for index, group in enumerate(groups):
        room = (onsets[index + 1] if index + 1 < len(groups) else last.start_s + last.duration_s) - onsets[index]
        spoken_after = (groups[index + 1].in_start if index + 1 < len(groups) else speech_end) - group.in_end
        cap = TAIL_MAX_S if index + 1 == len(groups) else math.inf
        ends.append(onsets[index] + room - min(spoken_after, CONSONANT_SHARE * room, cap))
    lead = min(groups[0].in_start - speech_start, LEAD_MAX_S)
    out = [onsets[0] - lead]
    into = [speech_start]
    for group, onset, end in zip(groups, onsets, ends, strict=True):
        spoken = group.in_end - group.in_start
        edge = min(EDGE_S, spoken / 3, (end - onset) / 3)
        out += [onset, onset + edge, end - edge, end]
        into += [group.in_start, group.in_start + edge, group.in_end - edge, group.in_end]
    tail = min(speech_end - groups[-1].in_end, TAIL_MAX_S, CONSONANT_SHARE * (ends[-1] - onsets[-1]))
    out.append(ends[-1] + max(tail, FRAME_S))
    into.append(speech_end)
    return _increasing(out), into


def _increasing(times: list[float]) -> list[float]:
    """The times nudged apart where rounding made two anchors meet (np.interp needs them increasing)."""
    fixed = [times[0]]
    for time in times[1:]:
        fixed.append(max(time, fixed[-1] + 1e-4))
    return fixed


def pitch_contour(times: Signal, notes: Sequence[SungNote], seed: int = 0) -> Signal:
    """MIDI pitch sung at each time: each note's, glides into it, vibrato on long notes, a little drift."""
    onsets = np.array([note.start_s for note in notes])
    pitches = np.array([note.pitch for note in notes])
    current = np.clip(np.searchsorted(onsets, times, side="right") - 1, 0, len(notes) - 1)
    midi = pitches[current].astype(np.float64)
    for index in range(1, len(notes)):
        start, end = onsets[index] - GLIDE_BEFORE_S, onsets[index] + GLIDE_AFTER_S
        inside = (times >= start) & (times < end)
        progress = (times[inside] - start) / (end - start)
        step = pitches[index] - pitches[index - 1]
        midi[inside] = pitches[index - 1] + step * (3 * progress**2 - 2 * progress**3)
    for index, note in enumerate(notes):
        if note.duration_s < VIBRATO_MIN_NOTE_S:
            continue
        end = onsets[index + 1] if index + 1 < len(notes) else note.start_s + note.duration_s + 1.0
        since = times - note.start_s - VIBRATO_DELAY_S
        inside = (since > 0) & (times < end - GLIDE_BEFORE_S)
        depth = VIBRATO_SEMITONES * np.minimum(since[inside] / VIBRATO_RAMP_S, 1.0)
        midi[inside] += depth * np.sin(2 * math.pi * VIBRATO_HZ * since[inside])
    rng = np.random.default_rng(seed)
    if times.size:
        knots = rng.normal(0.0, DRIFT_CENTS / 100, size=int((times[-1] - times[0]) / 0.25) + 2)
        midi += np.interp(times, times[0] + 0.25 * np.arange(knots.size), knots)
    return midi


def _breathe(track: Signal, phrases: Sequence[tuple[float, float]], rate: int) -> None:
    """A breath before each phrase that follows a rest long enough for one."""
    from scipy import signal  # here: scipy loads once a song is sung, not when the service starts

    band = signal.butter(2, (700.0, 4500.0), btype="bandpass", fs=rate, output="sos")
    rng = np.random.default_rng(7)
    previous_end = 0.0
    for start, end in phrases:
        rest = start - previous_end
        previous_end = end
        if rest < BREATH_MIN_REST_S:
            continue
        length = min(BREATH_S, 0.6 * rest)
        count = int(length * rate)
        noise = signal.sosfilt(band, rng.standard_normal(count))
        shape = np.sin(np.linspace(0.0, math.pi, count)) ** 2 * np.linspace(0.6, 1.0, count)
        breath = noise * shape
        breath *= BREATH_LEVEL / max(float(np.sqrt(np.mean(breath**2))), 1e-9)
        _add(track, breath, start - length - 0.04, rate)


def _add(buffer: Signal, samples: Signal, start_s: float, rate: int) -> None:
    start = int(round(start_s * rate))
    skip = max(-start, 0)
    end = min(start + samples.size, buffer.size)
    if start + skip < end:
        buffer[start + skip : end] += samples[skip : end - start]
