"""Lyric providers: write the words of a marketing song from a brief."""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import random
import re
import string
import tomllib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Protocol

import pydantic
from castad_contracts import brief, events
from castad_runtime.stage import cancellation

SectionKind = Literal["verse", "chorus", "bridge"]

SECONDS_PER_LINE = 2.5
MIN_LINES_PER_SECTION = 2
MAX_LINES_PER_SECTION = 6
MAX_PHRASES = 8
MAX_KEYWORDS = 10


class LyricProvider(Protocol):
    def write(
        self,
        brief: brief.Brief,
        seed: str,
        cancel: cancellation.Cancellation,
        attempt: int = 1,
        note: str | None = None,
    ) -> events.Lyrics:
        """The lyrics of `brief`, the same for the same `seed` (a pipeline); `attempt`: the job's counted attempt.

        `note`: what a person reviewing the last draft asked to change (a writer that cannot follow it writes anew
        from its new seed)."""
        ...


Words = Annotated[tuple[str, ...], pydantic.Field(min_length=1)]  # a list a line may draw from: never empty


@dataclasses.dataclass(frozen=True)
class Mood:
    """Words that colour a genre: adjectives, nouns, times of day and sung calls."""

    __pydantic_config__ = pydantic.ConfigDict(extra="forbid")

    adjectives: Words
    nouns: Words
    times: Words
    calls: Words


@dataclasses.dataclass(frozen=True)
class Phrasebook:
    """Line templates of one language. Fields in braces are slots; `{x:이}` adds a Korean particle."""

    __pydantic_config__ = pydantic.ConfigDict(extra="forbid")

    max_chars: Annotated[int, pydantic.Field(gt=0)]
    titles: Words
    openers: Words
    details: Words
    verses: Words
    hooks: Words
    choruses: Words
    bridges: Words
    moods: Mapping[brief.Style, Mood]


PHRASEBOOKS = importlib.resources.files(__package__) / "phrasebooks"  # one TOML file a language


class PhrasebookError(ValueError):
    """A phrasebook file that cannot be read, named with what is wrong in it."""


def phrasebook(language: brief.Language) -> Phrasebook:
    """The line templates of `language`, from its file in PHRASEBOOKS (read once)."""
    return phrasebooks()[language]


@functools.cache
def phrasebooks() -> dict[brief.Language, Phrasebook]:
    """Every language's phrasebook; a PhrasebookError naming the file and the field for one that is not right."""
    read = pydantic.TypeAdapter(Phrasebook)  # lists as tuples, styles as briefs name them ("k-pop")
    books = {}
    for language in brief.Language:
        name = f"{language.name.lower()}.toml"
        try:
            book = read.validate_python(tomllib.loads((PHRASEBOOKS / name).read_text("utf-8")))
        except (OSError, tomllib.TOMLDecodeError, pydantic.ValidationError) as error:
            raise PhrasebookError(f"phrasebook {name}: {error}") from error
        if missing := [style.value for style in brief.Style if style not in book.moods]:
            raise PhrasebookError(f"phrasebook {name}: moods: no words for {', '.join(missing)}")
        books[language] = book
    return books


_PHRASE_SPLIT = {
    brief.Language.KOREAN: re.compile(r"[,.;:!?·/\n]+|\s+그리고\s+|\s+및\s+"),
    brief.Language.ENGLISH: re.compile(r"[,.;:!?/\n]+|\s+and\s+", re.IGNORECASE),
    brief.Language.JAPANESE: re.compile(r"[、。,.;:!?！？・「」/\n\s]+"),
    brief.Language.CHINESE: re.compile(r"[，。、,.;:!?！？；：/\n\s]+"),
}
# Noun-like runs of Han characters or katakana, the keywords of Japanese and Chinese free text.
_HAN_OR_KATAKANA = re.compile(r"[\u4e00-\u9fff\u30a0-\u30ff]{2,8}")
_CHINESE_FUNCTION_CHARS = re.compile(r"[的和与在有是了也都就还很一个]")

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


def slots(template: str) -> tuple[str, ...]:
    """The template's fields, each once, in the order they stand.

    Filled in that order, a seed gives the same lyrics in every process (a set's order changes with each process's
    hash seed).
    """
    return tuple(dict.fromkeys(field for _, field, _, _ in _FORMATTER.parse(template) if field))


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
    if language == brief.Language.JAPANESE:
        return _dedupe(_HAN_OR_KATAKANA.findall(detail))[:MAX_KEYWORDS]
    if language == brief.Language.CHINESE:
        runs = (run for part in _PHRASE_SPLIT[language].split(detail) for run in _CHINESE_FUNCTION_CHARS.split(part))
        return _dedupe([run for run in runs if 2 <= len(run) <= 6])[:MAX_KEYWORDS]
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

    def __init__(self) -> None:
        phrasebooks()  # read when the service starts: a file that is not right stops it there, naming the file

    def write(
        self,
        brief: brief.Brief,
        seed: str,
        cancel: cancellation.Cancellation | None = None,
        attempt: int = 1,
        note: str | None = None,
    ) -> events.Lyrics:
        book = phrasebook(brief.language)
        vocabulary = Vocabulary(
            name=brief.customer_name,
            region=brief.region,
            phrases=phrases(brief.detail_region_info, brief.language, book.max_chars),
            keywords=keywords(brief.detail_region_info, brief.language),
            mood=book.moods[brief.style],
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
