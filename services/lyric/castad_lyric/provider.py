"""Lyric providers: write the words of a marketing song from a brief."""

from __future__ import annotations

import dataclasses
import random
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from castad_contracts import brief, events

SectionKind = Literal["verse", "chorus", "bridge"]

SECONDS_PER_LINE = 2.5
MIN_LINES_PER_SECTION = 2
MAX_LINES_PER_SECTION = 6
MAX_PHRASES = 8
MAX_KEYWORDS = 10


class LyricProvider(Protocol):
    def write(self, brief: brief.Brief, seed: str) -> events.Lyrics: ...


@dataclasses.dataclass(frozen=True)
class Mood:
    """Words that colour a genre: adjectives, nouns, times of day and sung calls."""

    adjectives: tuple[str, ...]
    nouns: tuple[str, ...]
    times: tuple[str, ...]
    calls: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Phrasebook:
    """Line templates of one language. Fields in braces are slots; `{x:이}` adds a Korean particle."""

    max_chars: int
    titles: tuple[str, ...]
    openers: tuple[str, ...]
    details: tuple[str, ...]
    verses: tuple[str, ...]
    hooks: tuple[str, ...]
    choruses: tuple[str, ...]
    bridges: tuple[str, ...]
    moods: Mapping[brief.Genre, Mood]


KOREAN = Phrasebook(
    max_chars=22,
    titles=("{region}의 {name}", "{name}의 노래", "{adj} {name}", "{region}, {name}", "안녕, {name}"),
    openers=(
        "{region}에 {noun:이} 내리면",
        "{adj} {region}의 {time}",
        "{region} 바람 따라 걸어",
        "발길이 닿은 곳 {region}",
        "{time}, {region}에서",
        "{region} 골목 끝에서",
        "{adj} {region:으로} 가요",
        "{region}의 {noun:을} 따라",
    ),
    details=(
        "{phrase}",
        "{phrase}, 거기서 만나",
        "{phrase} 그곳으로",
        "{kw:이} 기다리는 곳",
        "{kw:과} 함께하는 {time}",
        "{kw} 이야기 가득한 곳",
        "{kw}, 그리고 {noun}",
        "{adj} {kw:을} 만나러",
    ),
    verses=(
        "{adj} {noun:을} 따라서",
        "{adj} 하루 끝에 찾은 곳",
        "창밖엔 {noun}, 곁엔 너",
        "마음이 먼저 닿는 곳",
        "{noun:이} 머무는 자리",
        "{name:이} 문을 열면",
        "{name}에서 쉬어 가요",
        "우리 함께 걸어요",
        "{noun} 아래 웃음꽃",
        "다시 오고 싶은 곳",
        "{adj} 기억 하나 둘",
        "잠시 쉬어 가도 좋아",
    ),
    hooks=(
        "{call}, {name}",
        "{region}엔 {name:이} 있어",
        "오늘도 {name}에서 만나",
        "{adj} 그곳 {name}",
        "{name:으로} 놀러 와요",
        "{region}의 자랑 {name}",
        "언제라도 {name}",
        "여기가 바로 {name:이야}",
    ),
    choruses=(
        "{name:과} 함께라면",
        "{region}에서 만나요",
        "{call} {call}",
        "{adj} 오늘을 노래해",
        "{kw:과} 너, 그리고 나",
        "돌아와 {region:으로}",
        "우리의 {adj} 시간",
        "{noun:을} 담아 노래해",
        "손을 잡고 {region}에서",
        "{name}, {name}",
    ),
    bridges=(
        "시간이 흘러가도",
        "잊지 못할 {noun}",
        "{phrase}",
        "다시 여기 {region}",
        "{adj} 꿈을 꾸던 밤",
        "언젠가 또 만나요",
        "마음속에 {name}",
    ),
    moods={
        brief.Genre.KPOP: Mood(
            ("반짝이는", "설레는", "눈부신", "두근대는"),
            ("햇살", "별빛", "리듬", "무지개"),
            ("오늘 밤", "이번 주말", "지금 이 순간"),
            ("예이예", "랄랄라", "오오오"),
        ),
        brief.Genre.BALLAD: Mood(
            ("그리운", "따스한", "잔잔한", "포근한"),
            ("노을", "추억", "달빛", "바람"),
            ("해 질 무렵", "조용한 밤", "어느 저녁"),
            ("음음", "오오"),
        ),
        brief.Genre.HIPHOP: Mood(
            ("거침없는", "뜨거운", "자유로운", "당당한"),
            ("비트", "에너지", "리듬", "골목"),
            ("오늘 밤", "지금 당장", "매일 매일"),
            ("예", "렛츠 고", "요"),
        ),
        brief.Genre.ROCK: Mood(
            ("뜨거운", "힘찬", "거침없는", "끝없는"),
            ("함성", "불꽃", "바람", "질주"),
            ("이 밤", "지금", "밤새도록"),
            ("헤이", "워어", "예"),
        ),
        brief.Genre.JAZZ: Mood(
            ("느긋한", "은은한", "낭만적인", "부드러운"),
            ("선율", "커피 향", "달빛", "밤공기"),
            ("늦은 밤", "어느 저녁", "비 오는 날"),
            ("두비두바", "샤바다", "음"),
        ),
        brief.Genre.TROT: Mood(
            ("정다운", "흥겨운", "구성진", "신나는"),
            ("인연", "사랑", "웃음꽃", "정"),
            ("오늘 하루", "이 밤", "좋은 날"),
            ("얼씨구", "좋다 좋아", "어기야"),
        ),
        brief.Genre.ACOUSTIC: Mood(
            ("소박한", "싱그러운", "포근한", "맑은"),
            ("햇살", "바람", "기타 소리", "풀내음"),
            ("아침 햇살 속", "주말 오후", "산책길"),
            ("라라라", "음", "랄라"),
        ),
    },
)

ENGLISH = Phrasebook(
    max_chars=40,
    titles=("{name} Song", "Hello, {name}", "{region} Days at {name}", "Meet Me at {name}", "{adj} {name}"),
    openers=(
        "Down the streets of {region}",
        "{time} in {region}",
        "Where the {noun} meets {region}",
        "Take me back to {region}",
        "{adj} days in {region}",
        "There's a place in {region}",
        "{region} is calling me",
    ),
    details=(
        "{phrase}",
        "{phrase}, that's where I'll be",
        "{phrase}, come and see",
        "Come and find the {kw}",
        "Good friends and {kw}",
        "All the {kw} you need",
        "{kw} and {noun}, {time}",
    ),
    verses=(
        "Every {noun} leads me there",
        "{adj} hearts and {noun}",
        "Open doors at {name}",
        "Slow down, stay a while",
        "Under the {adj} {noun}",
        "A little {noun} every day",
        "{time} and we're alive",
        "Step inside {name}",
        "Leave your worries at the door",
        "Smiles on every face",
    ),
    hooks=(
        "{call}, {name}",
        "Meet me at {name}",
        "{name}, {name}",
        "{region}'s own {name}",
        "Here at {name}, {time}",
        "Come on down to {name}",
        "Oh {name}, take me home",
    ),
    choruses=(
        "{adj} and free in {region}",
        "We sing it loud, {call}",
        "Every day's a {adj} day",
        "{kw} and you and me",
        "This is where we belong",
        "Light it up, {region}",
        "Nowhere else I'd rather be",
        "Hold on to this {noun}",
    ),
    bridges=(
        "When the {noun} fades away",
        "{phrase}",
        "Remember {region}",
        "We'll come back, we always do",
        "{adj} dreams at {name}",
        "Just one more {noun}",
    ),
    moods={
        brief.Genre.KPOP: Mood(
            ("shining", "electric", "sparkling", "brand new"),
            ("sunlight", "starlight", "rhythm", "rainbow"),
            ("tonight", "this weekend", "right now"),
            ("oh-oh", "la-la", "hey hey"),
        ),
        brief.Genre.BALLAD: Mood(
            ("tender", "golden", "quiet", "gentle"),
            ("sunset", "memory", "moonlight", "breeze"),
            ("at dusk", "late at night", "this evening"),
            ("oh", "ooh"),
        ),
        brief.Genre.HIPHOP: Mood(
            ("bold", "fresh", "wild", "real"),
            ("beat", "groove", "energy", "block"),
            ("tonight", "all day", "every day"),
            ("yeah", "uh", "let's go"),
        ),
        brief.Genre.ROCK: Mood(
            ("burning", "loud", "restless", "endless"),
            ("fire", "thunder", "highway", "roar"),
            ("tonight", "right now", "all night"),
            ("hey", "whoa", "oh yeah"),
        ),
        brief.Genre.JAZZ: Mood(
            ("mellow", "smoky", "velvet", "easy"),
            ("melody", "coffee", "moonlight", "night air"),
            ("after hours", "late tonight", "this evening"),
            ("doo-bee-doo", "ba-da", "oh"),
        ),
        brief.Genre.TROT: Mood(
            ("cheerful", "joyful", "lively", "warm"),
            ("fortune", "love", "laughter", "good times"),
            ("all day long", "tonight", "this season"),
            ("hey", "ya-ho", "oh-ho"),
        ),
        brief.Genre.ACOUSTIC: Mood(
            ("simple", "fresh", "gentle", "bright"),
            ("sunshine", "breeze", "guitar", "meadow"),
            ("this morning", "all afternoon", "on Sunday"),
            ("la-la", "hmm", "oh"),
        ),
    },
)

_PHRASEBOOKS = {brief.Language.KOREAN: KOREAN, brief.Language.ENGLISH: ENGLISH}

_PHRASE_SPLIT = {
    brief.Language.KOREAN: re.compile(r"[,.;:!?·/\n]+|\s+그리고\s+|\s+및\s+"),
    brief.Language.ENGLISH: re.compile(r"[,.;:!?/\n]+|\s+and\s+", re.IGNORECASE),
}

_ENGLISH_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "by",
        "from",
        "with",
        "our",
        "your",
        "their",
        "its",
        "is",
        "are",
        "be",
        "near",
        "very",
        "just",
        "only",
        "also",
        "this",
        "that",
        "these",
        "those",
        "there",
        "here",
        "it",
        "we",
        "you",
        "they",
        "has",
        "have",
        "all",
    ]
)
_KOREAN_MODIFIER_ENDINGS = tuple("는은한운인된던고며서다요게면")
_KOREAN_PARTICLES = ("에서", "으로", "까지", "부터", "처럼", "이", "가", "을", "를", "의", "에", "도", "와", "과", "로")
_PARTICLE_AFTER_BATCHIM = {"이": True, "가": False, "을": True, "를": False, "과": True, "와": False}

_HANGUL_FIRST, _HANGUL_LAST = 0xAC00, 0xD7A3
_RIEUL_FINAL = 8
_DIGIT_FINALS = {"0": 21, "1": 8, "3": 16, "6": 1, "7": 8, "8": 8}
_LATIN_FINALS = {"l": 8, "m": 16, "n": 4}

# particle spec -> (after a final consonant, after a vowel)
_JOSA = {
    "이": ("이", "가"),
    "은": ("은", "는"),
    "을": ("을", "를"),
    "과": ("과", "와"),
    "아": ("아", "야"),
    "이야": ("이야", "야"),
    "으로": ("으로", "로"),
}


def final_consonant(word: str) -> int:
    """Index of the final consonant (jongseong) of the word's last sound; 0 when it ends in a vowel."""
    for char in reversed(word):
        if _HANGUL_FIRST <= ord(char) <= _HANGUL_LAST:
            return (ord(char) - _HANGUL_FIRST) % 28
        if char.isdigit():
            return _DIGIT_FINALS.get(char, 0)
        if char.isalpha():
            return _LATIN_FINALS.get(char.lower(), 0)
    return 0


def with_particle(word: str, spec: str) -> str:
    """Append the Korean particle named by spec ("이", "은", "을", "과", "아", "이야", "으로")."""
    after_consonant, after_vowel = _JOSA[spec]
    final = final_consonant(word)
    if spec == "으로" and final == _RIEUL_FINAL:
        return word + after_vowel
    return word + (after_consonant if final else after_vowel)


class _ParticleFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> Any:
        if format_spec in _JOSA:
            return with_particle(str(value), format_spec)
        return super().format_field(value, format_spec)


_FORMATTER = _ParticleFormatter()


def slots(template: str) -> frozenset[str]:
    return frozenset(field for _, field, _, _ in _FORMATTER.parse(template) if field)


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """What a template's slots may be filled with."""

    name: str
    region: str
    phrases: tuple[str, ...]
    keywords: tuple[str, ...]
    mood: Mood

    def options(self, slot: str) -> tuple[str, ...]:
        by_slot: dict[str, tuple[str, ...]] = {
            "name": (self.name,),
            "region": (self.region,),
            "phrase": self.phrases,
            "kw": self.keywords or self.mood.nouns,
            "adj": self.mood.adjectives,
            "noun": self.mood.nouns,
            "time": self.mood.times,
            "call": self.mood.calls,
        }
        return by_slot[slot]


def _dedupe(items: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for item in items if item))


def _chunk(words: Sequence[str], max_chars: int) -> list[str]:
    chunks: list[str] = []
    current = ""
    for word in words:
        candidate = f"{current} {word}".strip()
        if current and len(candidate) > max_chars:
            chunks.append(current)
            current = word
        else:
            current = candidate
    if current:
        chunks.append(current)
    return chunks


def phrases(detail: str, language: brief.Language, max_chars: int) -> tuple[str, ...]:
    """Split free text into short singable phrases."""
    parts = (part.strip() for part in _PHRASE_SPLIT[language].split(detail))
    chunks = [chunk for part in parts if part for chunk in _chunk(part.split(), max_chars)]
    return _dedupe(chunks)[:MAX_PHRASES]


def _korean_keyword(word: str) -> str:
    for particle in _KOREAN_PARTICLES:
        stem = word[: -len(particle)]
        if not word.endswith(particle) or len(stem) < 2:
            continue
        needs_batchim = _PARTICLE_AFTER_BATCHIM.get(particle)
        if needs_batchim is None or needs_batchim == bool(final_consonant(stem)):
            return stem
    return "" if word.endswith(_KOREAN_MODIFIER_ENDINGS) else word


def keywords(detail: str, language: brief.Language) -> tuple[str, ...]:
    """Pick the noun-like words of free text, stripped of particles."""
    words = re.findall(r"[\w'-]+", detail)
    if language == brief.Language.KOREAN:
        found = [_korean_keyword(word) for word in words]
        found = [word for word in found if 2 <= len(word) <= 8]
    else:
        found = [word for word in words if len(word) >= 3 and word.lower() not in _ENGLISH_STOPWORDS]
    return _dedupe(found)[:MAX_KEYWORDS]


def structure(duration_s: int) -> tuple[SectionKind, ...]:
    """The order of sections: longer songs get a bridge and a third verse."""
    if duration_s >= 100:
        return ("verse", "chorus", "verse", "chorus", "bridge", "verse", "chorus")
    if duration_s >= 45:
        return ("verse", "chorus", "verse", "chorus", "bridge", "chorus")
    return ("verse", "chorus", "verse", "chorus")


def lines_per_section(duration_s: int, sections: int) -> int:
    target = round(duration_s / SECONDS_PER_LINE / sections)
    return max(MIN_LINES_PER_SECTION, min(MAX_LINES_PER_SECTION, target))


class _Writer:
    """Fills templates with the vocabulary, never repeating a line within a song."""

    def __init__(self, book: Phrasebook, vocabulary: Vocabulary, rng: random.Random) -> None:
        self._book = book
        self._vocabulary = vocabulary
        self._rng = rng
        self._used_lines: set[str] = set()
        self._used_templates: set[str] = set()

    def line(self, templates: Sequence[str]) -> str:
        usable = [t for t in templates if all(self._vocabulary.options(s) for s in slots(t))]
        fresh = [t for t in usable if t not in self._used_templates]
        stale = [t for t in usable if t in self._used_templates]
        ordered = self._rng.sample(fresh, len(fresh)) + self._rng.sample(stale, len(stale))
        candidates = [(template, self._fill(template)) for template in ordered]
        fitting = [(t, line) for t, line in candidates if len(line) <= self._book.max_chars]
        unseen = [(t, line) for t, line in fitting if line not in self._used_lines]
        template, line = (unseen or fitting or sorted(candidates, key=lambda c: len(c[1])))[0]
        self._used_templates.add(template)
        self._used_lines.add(line)
        return line

    def _fill(self, template: str) -> str:
        values = {slot: self._rng.choice(self._vocabulary.options(slot)) for slot in slots(template)}
        text = _FORMATTER.format(template, **values)
        return text[:1].upper() + text[1:]


def _verse(writer: _Writer, book: Phrasebook, count: int) -> tuple[str, ...]:
    rest = [writer.line(book.verses + book.details) for _ in range(count - 2)]
    return (writer.line(book.openers), writer.line(book.details), *rest)


def _chorus(writer: _Writer, book: Phrasebook, count: int) -> tuple[str, ...]:
    middle = [writer.line(book.choruses) for _ in range(count - 1 - (count >= 4))]
    closing = [writer.line(book.hooks)] if count >= 4 else []
    return (writer.line(book.hooks), *middle, *closing)


def _bridge(writer: _Writer, book: Phrasebook, count: int) -> tuple[str, ...]:
    return tuple(writer.line(book.bridges) for _ in range(count))


class LocalLyricProvider:
    """Writes lyrics offline from phrase templates, deterministically for a seed."""

    def write(self, brief: brief.Brief, seed: str) -> events.Lyrics:
        book = _PHRASEBOOKS[brief.language]
        vocabulary = Vocabulary(
            name=brief.customer_name,
            region=brief.region,
            phrases=phrases(brief.detail_region_info, brief.language, book.max_chars),
            keywords=keywords(brief.detail_region_info, brief.language),
            mood=book.moods[brief.genre],
        )
        writer = _Writer(book, vocabulary, random.Random(seed))
        kinds = structure(brief.duration_s)
        count = lines_per_section(brief.duration_s, len(kinds))
        title = writer.line(book.titles)
        chorus = _chorus(writer, book, count)
        sections = [
            events.LyricSection(kind=kind, lines=chorus if kind == "chorus" else self._lines(writer, book, kind, count))
            for kind in kinds
        ]
        return events.Lyrics(title=title, language=brief.language, sections=tuple(sections))

    @staticmethod
    def _lines(writer: _Writer, book: Phrasebook, kind: SectionKind, count: int) -> tuple[str, ...]:
        return _bridge(writer, book, count) if kind == "bridge" else _verse(writer, book, count)
