"""Split lyric lines into sung syllables and spell them for the singing voice, per language.

A syllable is what one note of the melody sings: a Hangul syllable in Korean, a piece of an English
word around one vowel group, a mora of the reading in Japanese (a small kana, ン, ッ and ー join the
mora before them), a Han character in Chinese. Each keeps the characters of its line it sings, so
captions can highlight them. The voice is spelt for eSpeak NG: Korean and English as written,
Japanese as the kana of its reading (eSpeak reads no kanji), Chinese as eSpeak phonemes of its
pinyin (Debian's eSpeak has no Mandarin dictionary).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import pypinyin
from castad_contracts import brief
from pypinyin import style as pinyin_style

from castad_song import reading

_TOKEN = re.compile(r"[A-Za-z']+|[0-9]|\S")
_VOWEL_GROUP = re.compile(r"[aeiouy]+")
_HANGUL = re.compile(r"[\uac00-\ud7a3]")
_KANA = re.compile(r"[\u3041-\u3096\u30a1-\u30fa\u30fc]")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_JOINS_MORA_BEFORE = frozenset("ァィゥェォャュョヮンッー")
_KATAKANA_OFFSET = 0x60  # ひらがな -> カタカナ


@dataclasses.dataclass(frozen=True)
class Syllable:
    """One note's worth of a line: the characters it sings (`at` their offset), and how it sounds."""

    text: str
    at: int
    sound: str


def syllables(line: str, language: brief.Language) -> list[Syllable]:
    """Split a lyric line into the syllables its melody sings, in order."""
    if language is brief.Language.JAPANESE:
        return _japanese(line)
    return list(_syllables(line, 0, language))


def _syllables(text: str, offset: int, language: brief.Language) -> Iterator[Syllable]:
    for found in _TOKEN.finditer(text):
        token, at = found.group(), offset + found.start()
        if token[0].isascii() and token[0].isalpha() or token[0] == "'":
            yield from _english(token, at)
        elif token.isdigit() or _HANGUL.match(token) or _KANA.match(token):
            yield Syllable(token, at, token)
        elif _HAN.match(token):
            sound = pypinyin.lazy_pinyin(token)[0] if language is brief.Language.CHINESE else token
            yield Syllable(token, at, sound)


def _english(word: str, at: int) -> Iterator[Syllable]:
    """Pieces of a word around its vowel groups; a final silent e and a leading y sing with their neighbours."""
    lower = word.lower()
    groups = [m for m in _VOWEL_GROUP.finditer(lower) if not (m.start() == 0 and m.group() == "y" and len(lower) > 1)]
    stem = lower.removesuffix("'s")
    if len(groups) > 1 and groups[-1].group() == "e" and stem.endswith("e") and not stem.endswith("le"):
        groups.pop()
    if not groups:
        if word.strip("'"):
            yield Syllable(word, at, word)
        return
    cuts = [0]
    for before, after in zip(groups, groups[1:], strict=False):
        consonants = after.start() - before.end()
        cuts.append(after.start() - (1 if consonants >= 1 else 0) if consonants < 2 else before.end() + consonants // 2)
    cuts.append(len(word))
    for start, end in zip(cuts, cuts[1:], strict=False):
        yield Syllable(word[start:end], at + start, word[start:end])


# Japanese readings come from Janome in a process of its own, which holds its dictionary only while it is used.
_READER = reading.Reader()


def _katakana(text: str) -> str:
    return "".join(chr(ord(c) + _KATAKANA_OFFSET) if "\u3041" <= c <= "\u3096" else c for c in text)


def _morae(kana: str) -> list[str]:
    morae: list[str] = []
    for char in kana:
        if char in _JOINS_MORA_BEFORE and morae:
            morae[-1] += char
        elif _KANA.match(char):
            morae.append(char)
    return morae


def _japanese(line: str) -> list[Syllable]:
    found: list[Syllable] = []
    at = 0
    for surface, phonetic in _READER.read(line):
        start = line.find(surface, at)
        at = start + len(surface) if start >= 0 else at
        start = max(start, 0)
        kana = _katakana(phonetic if phonetic != "*" else surface)
        if not all(_KANA.match(char) for char in kana):
            found.extend(_syllables(surface, start, brief.Language.JAPANESE))
            continue
        morae = _morae(kana)
        for index, mora in enumerate(morae):
            # The written characters spread over the token's morae; a kanji sung over two morae is
            # shown with the first of them.
            first = -(-len(surface) * index // len(morae))
            last = -(-len(surface) * (index + 1) // len(morae))
            found.append(Syllable(surface[first:last], start + first, mora))
    return found


# eSpeak NG's Mandarin phonemes for pinyin: initials, then finals as pypinyin spells them (strict).
_INITIALS = {
    "b": "p", "p": "ph", "m": "m", "f": "f", "d": "t", "t": "th", "n": "n", "l": "l",
    "g": "k", "k": "kh", "h": "x", "j": "tC", "q": "tCh", "x": "C",
    "zh": "ts.", "ch": "ts.h", "sh": "s.", "r": "z.", "z": "ts", "c": "tsh", "s": "s",
}  # fmt: skip
_FINALS = {
    "a": "a", "o": "o", "e": "@", "i": "i", "u": "u", "v": "y", "ai": "ai", "ei": "ei", "ao": "au", "ou": "ou",
    "an": "an", "en": "@n", "ang": "aN", "eng": "@N", "ong": "oN", "er": "@r",
    "ia": "ia", "ie": "iE", "iao": "iau", "iou": "iou", "ian": "iEn", "in": "in", "iang": "iaN", "ing": "iN",
    "iong": "ioN", "ua": "ua", "uo": "uo", "uai": "uai", "uei": "uei", "uan": "uan", "uen": "u@n",
    "uang": "uaN", "ueng": "u@N", "ve": "yE", "van": "yan", "vn": "yn", "ê": "E", "n": "@n", "ng": "@N", "m": "@m",
}  # fmt: skip


def mandarin_phonemes(pinyin: str) -> str:
    """eSpeak NG's phonemes for one syllable of pinyin (tones left out: the melody sings the pitch)."""
    initial = pinyin_style.convert(pinyin, pypinyin.Style.INITIALS, strict=True)
    final = pinyin_style.convert(pinyin, pypinyin.Style.FINALS, strict=True)
    if final == "i" and initial in ("zh", "ch", "sh", "r"):
        vowel = "i."
    elif final == "i" and initial in ("z", "c", "s"):
        vowel = "i["
    else:
        vowel = _FINALS.get(final, final)
    return _INITIALS.get(initial, "") + vowel


def spelling(sung: list[Syllable], language: brief.Language) -> str:
    """The text eSpeak NG is to speak for a line's syllables (`[[...]]` holds phonemes)."""
    words: list[str] = []
    previous_end = -1
    for syllable in sung:
        if language is brief.Language.CHINESE and _HAN.match(syllable.text or " "):
            words.append(f"[[{mandarin_phonemes(syllable.sound)}]]")
        elif words and syllable.at == previous_end:
            words[-1] += syllable.sound  # the next piece of the same word, or a kanji's next mora
        else:
            words.append(syllable.sound)
        previous_end = syllable.at + len(syllable.text)
    return " ".join(words)
