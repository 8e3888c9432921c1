"""Mix the voice over the instrumental and master the song to a streaming loudness, unclipped."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Signal = npt.NDArray[np.float64]

TARGET_LUFS = -14.0  # what streaming services play at; the song is measured as a listener hears it
PEAK = 0.89  # -1 dBFS: room for the AAC encoder's overshoot
VOICE_OVER_LEAD = 1.6  # the voice sings about 4 dB louder than the synth lead played the melody
LEAD_UNDER_VOICE = 0.3  # the lead still doubles the melody, softly, under the voice
EDGE_FADE_S = 0.02
FADE_OUT_S = 1.0
LIMITER_S = 0.004  # the limiter's look-ahead and release: shorter than a drum hit, too short to pump
SILENT = 1e-4


def level(samples: Signal) -> float:
    """RMS of the part of a track that sounds (a voice's rests would make it look quiet)."""
    sounding = samples[np.abs(samples) > SILENT]
    return float(np.sqrt(np.mean(sounding**2))) if sounding.size else 0.0


def mix(backing: Signal, lead: Signal, voice: Signal | None) -> Signal:
    """The backing, the lead, and the voice (when there is one) set above where the lead was."""
    if voice is None or level(voice) == 0.0:
        return backing + lead
    return backing + LEAD_UNDER_VOICE * lead + voice * (VOICE_OVER_LEAD * level(lead) / level(voice))


def master(samples: Signal, sample_rate: int) -> Signal:
    """Fade the edges, bring the song to TARGET_LUFS and hold its peaks under PEAK."""
    song = samples.copy()
    fade_in = min(int(EDGE_FADE_S * sample_rate), song.size // 2)
    fade_out = min(int(min(FADE_OUT_S, 0.05 * song.size / sample_rate) * sample_rate), song.size // 2)
    if fade_in:
        song[:fade_in] *= np.linspace(0.0, 1.0, fade_in)
    if fade_out:
        song[-fade_out:] *= np.linspace(1.0, 0.0, fade_out)
    import pyloudnorm  # here, not at the top: it loads scipy.signal, 1.8 s of every start of the song service

    meter = pyloudnorm.Meter(sample_rate)
    if song.size < meter.block_size * sample_rate or not np.any(song):
        peak = float(np.max(np.abs(song), initial=0.0))  # too short to measure loudness
        return song * (PEAK / peak) if peak > 0 else song
    # Limiting takes a little loudness off; a second pass makes up for it.
    for _ in range(2):
        loudness = meter.integrated_loudness(song)
        if np.isfinite(loudness):
            song = song * 10.0 ** ((TARGET_LUFS - loudness) / 20.0)
        song = limit(song, sample_rate)
    return song


def limit(samples: Signal, sample_rate: int) -> Signal:
    """Turn the gain down smoothly around each peak above PEAK, so none is clipped."""
    needed = np.minimum(1.0, PEAK / np.maximum(np.abs(samples), 1e-12))
    window = max(int(LIMITER_S * sample_rate), 1)
    # The minimum over twice the window, then averaged over the window: the gain stays below what
    # each peak needs and still moves smoothly.
    from scipy import ndimage  # here: scipy loads only once a song is mastered, not when the service starts

    least: Signal = ndimage.minimum_filter1d(needed, size=2 * window + 1)
    gain: Signal = ndimage.uniform_filter1d(least, size=window)
    return np.clip(samples * gain, -PEAK, PEAK)
