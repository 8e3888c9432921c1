"""The singing voice, measured as a listener would hear it: pitch, syllables, rests, loudness.

These run the real synthesis (eSpeak NG and WORLD) on a few seconds of song per language.
"""

from __future__ import annotations

import functools
import pathlib
import subprocess
import wave

import numpy as np
import numpy.typing as npt
import pyloudnorm
import pytest
import pyworld
from castad_contracts import brief, events
from castad_runtime.stage import cancellation
from castad_song import espeak, g2p, mix, provider, score, synth, voice
from castad_testkit import briefs

RATE = 22050
FRAME_S = 0.005
Signal = npt.NDArray[np.float64]

LYRICS = {
    brief.Language.KOREAN: ("군산에 노을이 내리면", "바다가 보이는 한옥", "오늘도 스테이 머뭄에서"),
    brief.Language.ENGLISH: ("There's a place in Gunsan", "Come and find the village", "Simple and free"),
    brief.Language.JAPANESE: ("たどり着いたよ群山", "韓屋、そして思い出", "ステイ・モムムへおいでよ"),
    brief.Language.CHINESE: ("一起去群山", "韩屋独栋民宿在等着你", "快来住在慕姆吧"),
}


def _lyrics(language: brief.Language) -> events.Lyrics:
    lines = LYRICS[language]
    return events.Lyrics(
        title="t",
        language=language,
        sections=(
            events.LyricSection(kind="verse", lines=lines[:2]),
            events.LyricSection(kind="chorus", lines=lines[2:]),
        ),
    )


@functools.cache
def _singer() -> voice.Voice:
    return voice.Voice(voice.SINGERS["female"])


@functools.cache
def _sung(language: brief.Language) -> tuple[score.Arrangement, Signal]:
    """The arrangement of a short song and its voice alone."""
    arrangement = score.arrange(
        briefs.sample("Stay", region="Gunsan", language=language, genre="ballad", duration_s=12),
        _lyrics(language),
        "seed",
    )
    track = _singer().sing(arrangement.phrases, language, arrangement.duration_s, RATE)
    return arrangement, track


def _pitch(track: Signal) -> tuple[Signal, Signal]:
    """Times and MIDI pitch of each frame (NaN where unvoiced), by WORLD's DIO and StoneMask."""
    f0, times = pyworld.dio(track, RATE, f0_floor=100.0, f0_ceil=900.0, frame_period=FRAME_S * 1000)
    f0 = pyworld.stonemask(track, f0, times, RATE)
    return times, np.where(f0 > 0, 69.0 + 12.0 * np.log2(np.maximum(f0, 1e-9) / 440.0), np.nan)


def _written(arrangement: score.Arrangement, times: Signal) -> Signal:
    """The written melody at each time: each note until the next starts within its phrase, NaN in rests."""
    target = np.full(times.size, np.nan)
    for phrase in arrangement.phrases:
        for note, later in zip(phrase.notes, [*phrase.notes[1:], None], strict=True):
            end = later.start_s if later is not None else note.start_s + note.duration_s
            target[(times >= note.start_s) & (times < end)] = note.pitch
    return target


def _envelope(track: Signal) -> Signal:
    """Loudness of the track in dB, every FRAME_S, over 20 ms windows."""
    hop, size = int(FRAME_S * RATE), int(0.02 * RATE)
    frames = np.lib.stride_tricks.sliding_window_view(track, size)[::hop]
    return 10 * np.log10(np.mean(frames**2, axis=1) + 1e-12)


@pytest.mark.parametrize("language", list(LYRICS))
def test_the_voice_sings_the_written_melody_within_half_a_semitone(language: brief.Language) -> None:
    arrangement, track = _sung(language)
    times, sung = _pitch(track)
    written = _written(arrangement, times)

    voiced = ~np.isnan(sung)
    on_pitch = voiced & (np.abs(sung - written) < 0.5)  # a voiced frame in a rest counts as off

    assert voiced.sum() > 200
    assert on_pitch.sum() / voiced.sum() >= 0.8


@pytest.mark.parametrize("language", list(LYRICS))
def test_each_line_is_sung_in_as_many_syllables_as_it_has(language: brief.Language) -> None:
    """A syllable counts as sung when the voice holds its note: voiced and on pitch for most of it."""
    arrangement, track = _sung(language)
    times, sung = _pitch(track)

    for line, phrase in zip(arrangement.timed_lines, arrangement.phrases, strict=True):
        counted = 0
        for note in phrase.notes:
            during = (times >= note.start_s) & (times < note.start_s + note.duration_s)
            held = np.abs(sung[during] - note.pitch) < 0.5
            counted += bool(held.mean() >= 0.5)
        written = len(g2p.syllables(line.text, language))
        assert abs(counted - written) <= max(1, round(0.1 * written)), (line.text, counted, written)


@pytest.mark.parametrize("language", [brief.Language.KOREAN, brief.Language.ENGLISH])
def test_the_voice_is_silent_between_phrases_where_the_melody_rests(language: brief.Language) -> None:
    arrangement, track = _sung(language)
    loudness = _envelope(track)
    times = np.arange(loudness.size) * FRAME_S + 0.01
    singing = loudness[(times > arrangement.timed_lines[0].start_s + 0.1) & (times < arrangement.timed_lines[0].end_s)]

    for before, after in zip(arrangement.timed_lines, arrangement.timed_lines[1:], strict=False):
        # The rest, less the tail of the last vowel and the breath and first consonants of the next phrase.
        rest = (times > before.end_s + voice.TAIL_MAX_S + 0.05) & (times < after.start_s - 0.45)
        if rest.sum() >= 4:
            assert loudness[rest].max() < np.median(singing) - 30.0


def test_every_language_is_sung_in_its_own_voice_and_words() -> None:
    names = [f"{code}+{voice.SINGERS['female'].variant}" for code in voice.LANGUAGES.values()]

    assert espeak.missing_voices(names) == []
    assert g2p.spelling(g2p.syllables("群山", brief.Language.JAPANESE), brief.Language.JAPANESE).isalpha()
    assert g2p.spelling(g2p.syllables("群山", brief.Language.CHINESE), brief.Language.CHINESE) == "[[tChyn]] [[s.an]]"


@pytest.mark.parametrize(
    ("text", "language", "expected"),
    [
        (
            "안녕, coffee time at Luna's 24",
            brief.Language.KOREAN,
            ["안", "녕", "cof", "fee", "time", "at", "Lu", "na's", "2", "4"],
        ),
        ("There's a village", brief.Language.ENGLISH, ["There's", "a", "vil", "lage"]),
        ("ステイ・モムムへ", brief.Language.JAPANESE, ["ス", "テ", "イ", "モ", "ム", "ム", "へ"]),
        ("東京", brief.Language.JAPANESE, ["東", "京"]),
        ("韩屋，民宿", brief.Language.CHINESE, ["韩", "屋", "民", "宿"]),
    ],
)
def test_lines_split_into_the_syllables_of_their_language(
    text: str, language: brief.Language, expected: list[str]
) -> None:
    found = g2p.syllables(text, language)

    assert [syllable.text for syllable in found] == expected
    assert all(text[s.at : s.at + len(s.text)] == s.text for s in found)


def test_a_missing_espeak_says_that_make_setup_installs_it() -> None:
    def no_library(command: object) -> object:
        return subprocess.CompletedProcess(command, 1, '{"error": "cannot load libespeak-ng.so.1"}\n', "")

    with pytest.raises(espeak.EspeakMissing, match="make setup"):
        espeak.missing_voices(["ko+f3"], run=no_library)  # type: ignore[arg-type]


# English lines holding the Korean words of a brief: Debian 12's eSpeak NG crashes speaking them in one run.
MIXED = [
    "All afternoon in 군산",
    "Come and find the 바다가",
    "군산's own 가게 6",
    "Light it up 군산",
    "군산 is calling me",
    "바다가 보이는 한옥 come and see",
    "군산's own 가게 6",
    "Light it up 군산",
]


def test_phrases_the_library_crashes_on_together_are_each_spoken_alone() -> None:
    spoken = espeak.speak([("en+f3", line) for line in MIXED])
    assert len(spoken) == len(MIXED)
    assert all(speech.samples.size > 0 and speech.phonemes for speech in spoken)


def test_a_phrase_that_crashes_the_library_alone_fails_the_song() -> None:
    def crashing(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, -11, "", "")

    with pytest.raises(espeak.EspeakFailed, match="-11"):
        espeak.speak([("en+f3", "one"), ("en+f3", "two")], run=crashing)  # type: ignore[arg-type]


def test_the_sung_song_is_at_streaming_loudness_and_never_clips(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "song.wav"
    provider.LocalSongProvider().compose(
        briefs.sample("Stay", region="Gunsan", genre="ballad", duration_s=12),
        _lyrics(brief.Language.KOREAN),
        out,
        "seed",
        cancel=cancellation.Cancellation(),
    )
    with wave.open(str(out), "rb") as song:
        pcm = np.frombuffer(song.readframes(song.getnframes()), dtype="<i2")
        rate = song.getframerate()

    loudness = pyloudnorm.Meter(rate).integrated_loudness(pcm / 32768.0)

    assert -16.0 <= loudness <= -12.0
    assert np.max(np.abs(pcm.astype(np.int32))) < 32767


def test_the_voice_is_at_least_as_loud_as_the_lead_was() -> None:
    arrangement, track = _sung(brief.Language.KOREAN)
    lead = synth.render(arrangement, RATE, voices=frozenset({"lead"}))
    backing = synth.render(arrangement, RATE, voices=score.BACKING)
    mixed = mix.mix(backing, lead, track)

    voice_in_mix = mixed - backing - mix.LEAD_UNDER_VOICE * lead

    assert mix.level(voice_in_mix) >= mix.level(lead)


def test_syllables_are_timed_on_their_notes_in_the_event() -> None:
    arrangement, _ = _sung(brief.Language.KOREAN)

    for line in arrangement.timed_lines:
        assert len(line.syllables) == len(g2p.syllables(line.text, brief.Language.KOREAN))
        assert line.start_s == line.syllables[0].start_s and line.end_s == line.syllables[-1].end_s
        assert all(a.end_s <= b.start_s + 1e-9 for a, b in zip(line.syllables, line.syllables[1:], strict=False))
