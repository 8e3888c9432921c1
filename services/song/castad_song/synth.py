"""The song played: additive synthesis of a score's notes, and the WAV its samples are written to."""

from __future__ import annotations

import math
import pathlib
import wave
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from castad_song import score, styles

Signal = npt.NDArray[np.float64]

CHECK_EVERY_NOTES = 64  # how often synthesis looks whether its attempt was cancelled
_GAINS: dict[score.Voice, float] = {"lead": 0.5, "chord": 0.11, "bass": 0.3, "kick": 0.55, "snare": 0.28, "hat": 0.09}


def _envelope(count: int, sample_rate: int, timbre: styles.Timbre) -> Signal:
    envelope = np.ones(count)
    attack = min(int(timbre.attack_s * sample_rate), count // 2)
    release = min(int(timbre.release_s * sample_rate), count // 2)
    if attack:
        envelope[:attack] = np.linspace(0.0, 1.0, attack)
    if release:
        envelope[-release:] *= np.linspace(1.0, 0.0, release)
    return envelope


def _tone(pitch: float, count: int, sample_rate: int, timbre: styles.Timbre) -> Signal:
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


def _drums(sample_rate: int) -> dict[score.Voice, Signal]:
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
    arrangement: score.Arrangement,
    sample_rate: int,
    check: Callable[[], None] = lambda: None,
    voices: frozenset[score.Voice] = frozenset(_GAINS),
) -> Signal:
    """Synthesize the arrangement's notes of `voices`, unmastered.

    `check` is called between notes (it raises to stop the work).
    """
    buffer = np.zeros(int(round(arrangement.duration_s * sample_rate)))
    drums = _drums(sample_rate)
    timbres: dict[score.Voice, styles.Timbre] = {
        "lead": arrangement.style.lead,
        "chord": arrangement.style.pad,
        "bass": styles.BASS,
    }
    tones: dict[tuple[score.Voice, float, int], Signal] = {}
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
