from __future__ import annotations

import dataclasses
import pathlib
import statistics
import wave

import numpy as np
import numpy.typing as npt
import pytest
from castad_contracts import brief, events
from castad_runtime.stage import cancellation
from castad_song import g2p, instant, provider, score, styles

BRIEF = brief.Brief(customer_name="스테이 머뭄", region="군산", genre=brief.Style.KPOP.value, duration_s=12)
LYRICS = events.Lyrics(
    title="군산의 스테이 머뭄",
    language=brief.Language.KOREAN,
    sections=(
        events.LyricSection(kind="verse", lines=("군산에 노을이 내리면", "바다가 보이는 한옥")),
        events.LyricSection(kind="chorus", lines=("오늘도 스테이 머뭄에서", "랄랄라 만나요")),
        events.LyricSection(kind="verse", lines=("골목 끝에서 쉬어 가요", "다시 오고 싶은 곳")),
        events.LyricSection(kind="chorus", lines=("오늘도 스테이 머뭄에서", "랄랄라 만나요")),
    ),
)


@dataclasses.dataclass(frozen=True)
class Wav:
    channels: int
    sample_width: int
    sample_rate: int
    samples: npt.NDArray[np.int16]

    @property
    def duration_s(self) -> float:
        return self.samples.size / self.sample_rate


def read(path: pathlib.Path) -> Wav:
    with wave.open(str(path), "rb") as song:
        samples = np.frombuffer(song.readframes(song.getnframes()), dtype="<i2")
        return Wav(song.getnchannels(), song.getsampwidth(), song.getframerate(), samples)


def compose(
    tmp_path: pathlib.Path,
    source: brief.Brief = BRIEF,
    lyrics: events.Lyrics = LYRICS,
    name: str = "song.wav",
    singer: str | None = "female",
) -> tuple[provider.Song, pathlib.Path]:
    out = tmp_path / name
    return provider.LocalSongProvider(singer=singer).compose(
        source, lyrics, out, seed="pipeline-1", cancel=cancellation.Cancellation()
    ), out


def test_the_song_is_a_16_bit_mono_wav_at_the_sample_rate(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "song.wav"
    provider.LocalSongProvider(sample_rate=16000).compose(
        BRIEF, LYRICS, out, seed="s", cancel=cancellation.Cancellation()
    )

    wav = read(out)

    assert (wav.channels, wav.sample_width, wav.sample_rate) == (1, 2, 16000)


@pytest.mark.parametrize("duration_s", [3, 12, 47])
def test_the_song_lasts_as_long_as_the_brief_asks(tmp_path: pathlib.Path, duration_s: int) -> None:
    song, out = compose(tmp_path, BRIEF.model_copy(update={"duration_s": duration_s}))

    assert abs(read(out).duration_s - duration_s) < 0.1
    assert abs(song.duration_s - duration_s) < 0.1


def test_the_song_is_loud_but_does_not_clip(tmp_path: pathlib.Path) -> None:
    samples = read(compose(tmp_path)[1]).samples
    scaled = samples / 32768.0

    assert np.sqrt(np.mean(scaled**2)) > 0.05
    assert np.max(np.abs(samples)) < 32767


def test_the_song_starts_and_ends_without_a_click(tmp_path: pathlib.Path) -> None:
    samples = read(compose(tmp_path)[1]).samples

    assert abs(int(samples[0])) < 100
    assert abs(int(samples[-1])) < 100


def test_different_lyrics_sound_different(tmp_path: pathlib.Path) -> None:
    other = LYRICS.model_copy(
        update={
            "sections": (events.LyricSection(kind="verse", lines=("전혀 다른 가사가 여기에",)), *LYRICS.sections[1:])
        }
    )
    first = read(compose(tmp_path, name="a.wav")[1]).samples
    second = read(compose(tmp_path, lyrics=other, name="b.wav")[1]).samples

    assert not np.array_equal(first, second)


def test_the_same_inputs_sound_the_same(tmp_path: pathlib.Path) -> None:
    first = read(compose(tmp_path, name="a.wav")[1]).samples
    second = read(compose(tmp_path, name="b.wav")[1]).samples

    assert np.array_equal(first, second)


def test_hip_hop_is_faster_and_busier_than_a_ballad() -> None:
    ballad = score.arrange(BRIEF.model_copy(update={"genre": brief.Style.BALLAD.value}), LYRICS, "s")
    hiphop = score.arrange(BRIEF.model_copy(update={"genre": brief.Style.HIPHOP.value}), LYRICS, "s")
    drums: frozenset[score.Voice] = frozenset({"kick", "snare", "hat"})

    assert styles.tempo_bpm(brief.Style.BALLAD) < styles.tempo_bpm(brief.Style.HIPHOP)
    assert hiphop.onsets_per_second(drums) > 2 * ballad.onsets_per_second(drums)


def test_each_style_has_its_own_sound(tmp_path: pathlib.Path) -> None:
    """Without a voice: the arrangement alone tells the styles apart (and a voice is a second of CPU a song)."""
    sounds = {
        read(
            compose(tmp_path, BRIEF.model_copy(update={"genre": style.value}), name=f"{style}.wav", singer=None)[1]
        ).samples.tobytes()
        for style in brief.Style
    }

    assert len(sounds) == len(brief.Style)


@pytest.mark.parametrize(
    ("genre", "style"),
    [
        ("pop, ambient", brief.Style.KPOP),
        ("acoustic folk", brief.Style.ACOUSTIC),
        ("Lo-Fi Hip Hop", brief.Style.BALLAD),
        ("smooth jazz, lounge", brief.Style.JAZZ),
        ("신나는 트로트", brief.Style.TROT),
        ("indie rock", brief.Style.ROCK),
        ("gregorian chant", brief.DEFAULT_STYLE),
    ],
)
def test_a_free_text_genre_is_sung_in_the_closest_style_it_names_first(genre: str, style: brief.Style) -> None:
    source = BRIEF.model_copy(update={"genre": genre})
    assert source.style is style
    assert score.arrange(source, LYRICS, "s").style.bpm == styles.tempo_bpm(style)


def test_every_lyric_line_is_timed_in_order_within_the_song(tmp_path: pathlib.Path) -> None:
    song, _ = compose(tmp_path)
    lines = song.timed_lines

    assert [line.text for line in lines] == LYRICS.lines()
    assert all(0 <= line.start_s < line.end_s <= song.duration_s for line in lines)
    assert all(before.end_s <= after.start_s for before, after in zip(lines, lines[1:], strict=False))
    assert lines[0].start_s < 0.15 * song.duration_s
    assert lines[-1].end_s > 0.85 * song.duration_s


def test_every_syllable_is_sung_as_one_note_inside_its_line() -> None:
    arrangement = score.arrange(BRIEF, LYRICS, "s")
    lead = [note for note in arrangement.notes if note.voice == "lead"]

    for line in arrangement.timed_lines:
        notes = [note for note in lead if line.start_s <= note.start_s < line.end_s]
        assert len(notes) == len(g2p.syllables(line.text, LYRICS.language)) == len(line.syllables)
    assert len(lead) == sum(len(g2p.syllables(text, LYRICS.language)) for text in LYRICS.lines())


def test_the_chorus_is_sung_higher_and_louder_than_the_verses() -> None:
    arrangement = score.arrange(BRIEF, LYRICS, "s")
    chorus_lines = set(LYRICS.sections[1].lines)

    def lead_notes(chorus: bool) -> list[score.Note]:
        windows = [line for line in arrangement.timed_lines if (line.text in chorus_lines) == chorus]
        return [
            note
            for note in arrangement.notes
            if note.voice == "lead" and any(w.start_s <= note.start_s < w.end_s for w in windows)
        ]

    chorus, verse = lead_notes(True), lead_notes(False)

    assert statistics.mean(n.pitch for n in chorus) > statistics.mean(n.pitch for n in verse)
    assert min(n.velocity for n in chorus) > max(n.velocity for n in verse)


@pytest.mark.parametrize("style", [brief.Style.KPOP, brief.Style.BALLAD, brief.Style.JAZZ])
def test_the_bars_are_the_grooves_bar_lines_four_beats_apart_over_the_whole_song(style: brief.Style) -> None:
    arrangement = score.arrange(BRIEF.model_copy(update={"genre": style.value}), LYRICS, "s")
    bar_s = score.BEATS_PER_BAR * 60.0 / styles.tempo_bpm(style)
    bars = np.array(arrangement.bars_s)
    kicks = sorted(note.start_s for note in arrangement.notes if note.voice == "kick")

    assert bars[0] == 0.0
    assert np.diff(bars) == pytest.approx(bar_s, abs=2e-3)
    assert bars[-1] < arrangement.duration_s <= bars[-1] + bar_s
    # Every style's kick pattern opens its bar: each bar line is a downbeat of the music played.
    assert all(min(abs(kick - bar) for kick in kicks) < 2e-3 for bar in bars)


def test_the_composed_song_tells_its_bars_and_the_instant_one_none(tmp_path: pathlib.Path) -> None:
    song, _ = compose(tmp_path, BRIEF.model_copy(update={"duration_s": 5}))
    silence = instant.InstantSongProvider().compose(
        BRIEF, LYRICS, tmp_path / "instant.wav", seed="s", cancel=cancellation.Cancellation()
    )

    assert song.bars_s == score.arrange(BRIEF.model_copy(update={"duration_s": 5}), LYRICS, "pipeline-1").bars_s
    assert len(song.bars_s) == 3  # 118 bpm: bars of 2.03 s in 5 s
    assert silence.bars_s == ()  # silence has no tempo
