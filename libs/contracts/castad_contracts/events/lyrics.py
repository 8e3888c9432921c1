"""Lyrics, as a writer makes them and a person edits them, and their lines as the song sings them."""

from __future__ import annotations

import re
import typing
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from castad_contracts import brief as brief_


class LyricSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["verse", "chorus", "bridge"]
    lines: tuple[str, ...]


class Lyrics(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str
    language: brief_.Language
    sections: tuple[LyricSection, ...]

    def lines(self) -> list[str]:
        return [line for section in self.sections for line in section.lines]

    def text(self) -> str:
        """As a person reads and edits them (the lyric stage's file): the title, then each `[kind]` and its lines."""
        parts = [self.title, ""]
        for section in self.sections:
            parts.append(f"[{section.kind}]")
            parts.extend(section.lines)
            parts.append("")
        return "\n".join(parts)


# What lyrics may hold: a person's edit is held to the limits a writer's lyrics are (castad_lyric.chat).
MAX_SECTIONS = 12
MAX_SECTION_LINES = 12
MAX_LINE_CHARS = 120
MAX_LYRICS_CHARS = 8_000
_SECTION_HEADING = re.compile(r"^\[(\w+)\]$")


def lyrics_from_text(text: str, language: brief_.Language) -> Lyrics:
    """Lyrics written as `Lyrics.text` writes them; ValueError saying what breaks the limits, and where."""
    if len(text) > MAX_LYRICS_CHARS:
        raise ValueError(f"are {len(text)} characters long, more than {MAX_LYRICS_CHARS}")
    title, kind = "", None
    sections: list[tuple[str, list[str], int]] = []
    lines: list[str] = []
    kinds = typing.get_args(LyricSection.model_fields["kind"].annotation)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if any(ord(char) < 32 and char != "\t" for char in line):
            raise ValueError(f"line {number} holds a control character")
        if len(line) > MAX_LINE_CHARS:
            raise ValueError(f"line {number} is {len(line)} characters long, more than {MAX_LINE_CHARS}")
        heading = _SECTION_HEADING.match(line)
        if not title and heading is not None:
            raise ValueError(f"line {number}: the first line is the title, before any section heading")
        if not title:
            title = line
        elif heading is not None:
            if heading.group(1) not in kinds:
                raise ValueError(f"line {number}: [{heading.group(1)}] is not a section ({', '.join(kinds)})")
            if kind is not None:
                sections.append((kind, lines, number))
            kind, lines = heading.group(1), []
        elif kind is None:
            raise ValueError(f"line {number} comes before the first section heading, such as [verse]")
        else:
            lines.append(line)
    if kind is not None:
        sections.append((kind, lines, len(text.splitlines())))
    if not title:
        raise ValueError("have no title: the first line is the title")
    if not sections:
        raise ValueError("have no section: write [verse], [chorus] or [bridge], then its lines")
    if len(sections) > MAX_SECTIONS:
        raise ValueError(f"have {len(sections)} sections, more than {MAX_SECTIONS}")
    for kind, lines, number in sections:
        if not lines:
            raise ValueError(f"the [{kind}] before line {number} has no lines")
        if len(lines) > MAX_SECTION_LINES:
            raise ValueError(f"a [{kind}] has {len(lines)} lines, more than {MAX_SECTION_LINES}")
    return Lyrics(
        title=title,
        language=language,
        sections=tuple(LyricSection(kind=kind, lines=tuple(lines)) for kind, lines, _ in sections),
    )


class TimedLineV2(BaseModel):
    """A lyric line and when it is sung (versions 1 and 2 of song.completed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    start_s: float = Field(ge=0)
    end_s: float = Field(ge=0)


class TimedSyllable(BaseModel):
    """A sung syllable of a line: the characters it sings and when."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(description="the characters of the line it sings; empty when it sings on the ones before")
    at: int = Field(ge=0, description="offset of those characters in the line's text")
    start_s: float = Field(ge=0)
    end_s: float = Field(ge=0)


class TimedLine(TimedLineV2):
    """A lyric line and when it is sung, and (version 3) when each of its syllables is."""

    syllables: tuple[TimedSyllable, ...] = Field(
        default=(), description="every syllable in order; empty when the singer did not say (a version-2 event)"
    )
