from __future__ import annotations

import os
import subprocess
import sys

import pytest
from castad_contracts import brief, events
from castad_lyric import provider

KOREAN = brief.Brief(
    customer_name="스테이 머뭄",
    region="군산",
    detail_region_info="바다가 보이는 조용한 한옥 스테이, 근대 문화 거리와 가까운 숙소",
    language=brief.Language.KOREAN,
    genre=brief.Style.BALLAD.value,
    duration_s=30,
)
ENGLISH = brief.Brief(
    customer_name="Cafe Luna",
    region="Jeonju",
    detail_region_info="Hand-drip coffee and fresh pastries, a short walk from the hanok village",
    language=brief.Language.ENGLISH,
    genre=brief.Style.JAZZ.value,
    duration_s=30,
)


def write(source: brief.Brief, seed: str = "pipeline-1") -> events.Lyrics:
    return provider.LocalLyricProvider().write(source, seed)


def text_of(lyrics: events.Lyrics) -> str:
    return "\n".join([lyrics.title, *lyrics.lines()])


@pytest.mark.parametrize("source", [KOREAN, ENGLISH], ids=["korean", "english"])
def test_lyrics_mention_the_business_and_its_region(source: brief.Brief) -> None:
    lyrics = write(source)

    assert source.customer_name in text_of(lyrics)
    assert source.region in text_of(lyrics)
    assert lyrics.language == source.language
    assert lyrics.title


@pytest.mark.parametrize("source", [KOREAN, ENGLISH], ids=["korean", "english"])
def test_every_chorus_names_the_business(source: brief.Brief) -> None:
    choruses = [section for section in write(source).sections if section.kind == "chorus"]

    assert all(any(source.customer_name in line for line in chorus.lines) for chorus in choruses)


@pytest.mark.parametrize("source", [KOREAN, ENGLISH], ids=["korean", "english"])
def test_verses_alternate_with_a_chorus_that_repeats_word_for_word(source: brief.Brief) -> None:
    sections = write(source).sections

    assert [section.kind for section in sections[:4]] == ["verse", "chorus", "verse", "chorus"]
    assert sections[1].lines == sections[3].lines
    assert sections[0].lines != sections[2].lines


def test_the_details_of_the_place_are_woven_into_the_verses() -> None:
    verses = "\n".join(line for s in write(KOREAN).sections if s.kind == "verse" for line in s.lines)

    assert any(word in verses for word in ("바다", "한옥", "스테이", "근대", "문화", "거리", "숙소"))


def test_the_genre_sets_the_mood_of_the_words() -> None:
    ballad = text_of(write(KOREAN.model_copy(update={"genre": brief.Style.BALLAD.value})))
    hiphop = text_of(write(KOREAN.model_copy(update={"genre": brief.Style.HIPHOP.value})))

    assert ballad != hiphop


def test_the_same_seed_writes_the_same_lyrics() -> None:
    assert write(KOREAN, "seed") == write(KOREAN, "seed")
    assert write(ENGLISH, "seed") == write(ENGLISH, "seed")


@pytest.mark.parametrize("source", [KOREAN, ENGLISH], ids=["korean", "english"])
def test_the_same_seed_writes_the_same_lyrics_in_every_process(source: brief.Brief) -> None:
    """Another replica, or the same service after a restart, runs with another hash seed.

    A retried attempt must still write what the first one would have.
    """
    program = (
        "import sys; from castad_contracts import brief; from castad_lyric import provider;"
        " source = brief.Brief.model_validate_json(sys.stdin.read());"
        " print(provider.LocalLyricProvider().write(source, 'seed').model_dump_json())"
    )
    written = {
        subprocess.run(
            [sys.executable, "-c", program],
            input=source.model_dump_json(),
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        ).stdout
        for hash_seed in ("1", "2", "3")
    }

    assert len(written) == 1


def test_different_seeds_write_different_lyrics() -> None:
    seeds = [f"pipeline-{n}" for n in range(5)]

    assert len({text_of(write(KOREAN, seed)) for seed in seeds}) == len(seeds)
    assert len({text_of(write(ENGLISH, seed)) for seed in seeds}) == len(seeds)


def test_korean_lyrics_are_mostly_hangul() -> None:
    letters = [char for char in text_of(write(KOREAN)) if char.isalpha()]
    hangul = [char for char in letters if "\uac00" <= char <= "\ud7a3"]

    assert len(hangul) / len(letters) > 0.9


def test_english_lyrics_contain_no_hangul() -> None:
    assert not any("\uac00" <= char <= "\ud7a3" for char in text_of(write(ENGLISH)))


@pytest.mark.parametrize(("source", "limit"), [(KOREAN, 22), (ENGLISH, 40)], ids=["korean", "english"])
def test_lines_are_short_enough_to_caption(source: brief.Brief, limit: int) -> None:
    for seed in ("a", "b", "c"):
        assert max(len(line) for line in write(source, seed).lines()) <= limit


def test_longer_songs_get_more_lines() -> None:
    lengths = [len(write(KOREAN.model_copy(update={"duration_s": d})).lines()) for d in (10, 30, 60, 180)]

    assert lengths == sorted(lengths)
    assert lengths[0] < lengths[-1]


def test_a_three_second_song_still_has_two_verses_and_two_choruses() -> None:
    lyrics = write(ENGLISH.model_copy(update={"duration_s": 3}))

    assert [section.kind for section in lyrics.sections] == ["verse", "chorus", "verse", "chorus"]
    assert all(section.lines for section in lyrics.sections)


def test_long_songs_get_a_bridge() -> None:
    kinds = [section.kind for section in write(KOREAN.model_copy(update={"duration_s": 90})).sections]

    assert "bridge" in kinds


def test_lyrics_need_no_details_about_the_place() -> None:
    lyrics = write(KOREAN.model_copy(update={"detail_region_info": ""}))

    assert KOREAN.customer_name in text_of(lyrics)
    assert len(lyrics.lines()) >= 8


@pytest.mark.parametrize(
    ("word", "particle", "expected"),
    [
        ("군산", "으로", "군산으로"),
        ("서울", "으로", "서울로"),
        ("부산", "이", "부산이"),
        ("카페", "이", "카페가"),
        ("머뭄", "이야", "머뭄이야"),
        ("오월", "과", "오월과"),
        ("스테이", "을", "스테이를"),
    ],
)
def test_korean_particles_follow_the_final_consonant(word: str, particle: str, expected: str) -> None:
    assert provider.with_particle(word, particle) == expected


def test_keywords_drop_particles_and_modifiers() -> None:
    found = provider.keywords("바다가 보이는 조용한 한옥 스테이", brief.Language.KOREAN)

    assert found == ("바다", "한옥", "스테이")


JAPANESE = brief.Brief(
    customer_name="海辺の本屋",
    region="鎌倉",
    detail_region_info="波の音が聞こえる小さな本屋、カフェとギャラリー",
    language=brief.Language.JAPANESE,
    genre="acoustic folk",
    duration_s=30,
)
CHINESE = brief.Brief(
    customer_name="海边书店",
    region="厦门",
    detail_region_info="听得见海浪声的小书店，有咖啡和画廊",
    language=brief.Language.CHINESE,
    genre="pop, ambient",
    duration_s=30,
)
KANA = ("\u3040", "\u30ff")
HAN = ("\u4e00", "\u9fff")


def share(text: str, *ranges: tuple[str, str]) -> float:
    letters = [char for char in text if char.isalpha()]
    return sum(any(low <= char <= high for low, high in ranges) for char in letters) / len(letters)


@pytest.mark.parametrize("seed", ["a", "b", "c"])
def test_japanese_lyrics_are_kana_and_kanji_name_the_place_and_fit_a_caption(seed: str) -> None:
    lyrics = write(JAPANESE, seed)
    text = text_of(lyrics)

    assert lyrics.language is brief.Language.JAPANESE
    assert JAPANESE.customer_name in text and JAPANESE.region in text
    assert share(text, KANA, HAN) > 0.95 and share(text, KANA) > 0.2
    assert max(len(line) for line in lyrics.lines()) <= 16


@pytest.mark.parametrize("seed", ["a", "b", "c"])
def test_chinese_lyrics_are_han_without_kana_name_the_place_and_fit_a_caption(seed: str) -> None:
    lyrics = write(CHINESE, seed)
    text = text_of(lyrics)

    assert lyrics.language is brief.Language.CHINESE
    assert CHINESE.customer_name in text and CHINESE.region in text
    assert share(text, HAN) > 0.95 and share(text, KANA) == 0
    assert max(len(line) for line in lyrics.lines()) <= 14


@pytest.mark.parametrize(
    ("detail", "language", "expected"),
    [
        ("波の音が聞こえる小さな本屋、カフェとギャラリー", brief.Language.JAPANESE, ("本屋", "カフェ", "ギャラリー")),
        ("有咖啡和画廊的小书店", brief.Language.CHINESE, ("咖啡", "画廊", "小书店")),
    ],
)
def test_keywords_of_japanese_and_chinese_text_are_its_noun_like_runs(detail, language, expected) -> None:
    assert provider.keywords(detail, language) == expected


@pytest.mark.parametrize("language", list(brief.Language))
def test_each_languages_phrasebook_has_a_mood_for_every_style_and_only_slots_the_writer_fills(language) -> None:
    book = provider.phrasebook(language)
    words = provider.Vocabulary("바다", "속초", ("책방",), ("책",), book.moods[brief.DEFAULT_STYLE])
    assert set(book.moods) == set(brief.Style)
    templates = [*book.titles, *book.openers, *book.details, *book.verses, *book.hooks, *book.choruses, *book.bridges]
    for template in templates:
        values = {slot: words.options(slot)[0] for slot in provider.slots(template)}  # KeyError: a slot unknown
        assert "{" not in provider._FORMATTER.format(template, **values), template  # a particle it knows


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (("choruses = [", "chorus = ["), "chorus"),  # one field misspelt: the unknown one and the missing one
        (('titles = ["', 'titles = [] #["'), "titles"),  # an empty list a line would draw from
        (('[moods."trot"]', '[moods."polka"]'), "polka"),  # a style briefs do not have
        (('[moods."trot"]', "[unused]"), "unused"),
        (("max_chars = 22", "max_chars = 22 22"), "korean.toml"),  # not TOML
    ],
)
def test_a_phrasebook_file_that_is_not_right_is_refused_naming_the_file_and_the_field(
    tmp_path, monkeypatch, change, named
):
    for language in brief.Language:
        name = f"{language.name.lower()}.toml"
        (tmp_path / name).write_text((provider.PHRASEBOOKS / name).read_text("utf-8"), "utf-8")
    korean = tmp_path / "korean.toml"
    text = korean.read_text("utf-8")
    assert change[0] in text
    korean.write_text(text.replace(change[0], change[1], 1), "utf-8")
    monkeypatch.setattr(provider, "PHRASEBOOKS", tmp_path)
    provider.phrasebooks.cache_clear()
    try:
        with pytest.raises(provider.PhrasebookError, match=r"phrasebook korean\.toml") as refused:
            provider.LocalLyricProvider()  # when the service starts, not at its first brief
    finally:
        provider.phrasebooks.cache_clear()
    assert named in str(refused.value)


def test_a_phrasebook_without_words_for_a_style_is_refused_naming_the_style(tmp_path, monkeypatch):
    for language in brief.Language:
        name = f"{language.name.lower()}.toml"
        (tmp_path / name).write_text((provider.PHRASEBOOKS / name).read_text("utf-8"), "utf-8")
    english = tmp_path / "english.toml"
    text = english.read_text("utf-8")
    english.write_text(text[: text.index('[moods."trot"]')] + text[text.index('[moods."acoustic"]') :], "utf-8")
    monkeypatch.setattr(provider, "PHRASEBOOKS", tmp_path)
    provider.phrasebooks.cache_clear()
    try:
        with pytest.raises(provider.PhrasebookError, match=r"phrasebook english\.toml: moods: no words for trot"):
            provider.phrasebook(brief.Language.ENGLISH)
    finally:
        provider.phrasebooks.cache_clear()
