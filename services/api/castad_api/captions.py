"""The song's sung lines as caption files, SubRip (SRT) and WebVTT, timed as the song stage told them.

A cue per sung line, from when its singing begins to when it ends (song.completed's `timed_lines`). The WebVTT
file also times each syllable within its cue (karaoke: a timestamp tag before the characters sung from then on,
which players that read them use to highlight the words as they are sung); a syllable sung at the cue's start, or
on the characters before it (empty), needs none. Lines are written as sung, in any language: UTF-8 throughout.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

from castad_contracts import api, events


def render(lines: Sequence[events.TimedLine], form: api.CaptionFormat) -> str:
    """The caption file of these lines in `form`."""
    return srt(lines) if form is api.CaptionFormat.SRT else webvtt(lines)


def srt(lines: Sequence[events.TimedLine]) -> str:
    """SubRip: a numbered cue per sung line, its times as HH:MM:SS,mmm."""
    return "".join(
        f"{number}\n{_time(start, ',')} --> {_time(end, ',')}\n{_ARROW.sub('->', _one_line(line.text))}\n\n"
        for number, (line, start, end) in enumerate(_cues(lines), 1)
    )


def webvtt(lines: Sequence[events.TimedLine]) -> str:
    """WebVTT: a numbered cue per sung line, each of its later syllables after a timestamp tag."""
    cues = (
        f"{number}\n{_time(start, '.')} --> {_time(end, '.')}\n{''.join(_karaoke(line, start, end))}\n\n"
        for number, (line, start, end) in enumerate(_cues(lines), 1)
    )
    return "WEBVTT\n\n" + "".join(cues)


def _cues(lines: Iterable[events.TimedLine]) -> Iterator[tuple[events.TimedLine, int, int]]:
    """Each line with words that is sung for a while, with its start and end in milliseconds, in sung order."""
    for line in sorted(lines, key=lambda line: line.start_s):
        start, end = _ms(line.start_s), _ms(line.end_s)
        if line.text.strip() and end > start:
            yield line, start, end


def _karaoke(line: events.TimedLine, start: int, end: int) -> Iterator[str]:
    """The line's text, escaped, with a timestamp tag where each syllable sung inside the cue begins."""
    text = _one_line(line.text)
    at, last = 0, start
    for syllable in line.syllables:
        begins = _ms(syllable.start_s)
        # A tag must fall inside its cue, after the one before it, where the line's characters allow one.
        if not syllable.text or not last < begins < end or not at < syllable.at <= len(text):
            continue
        yield _escaped(text[at : syllable.at])
        yield f"<{_time(begins, '.')}>"
        at, last = syllable.at, begins
    yield _escaped(text[at:])


_ARROW = re.compile(r"-{2,}>")  # a SubRip cue's text may not hold its timing's arrow: it would read as a new cue
# A blank line ends a cue in both formats: a line's text stays on one line, each break a space (offsets kept).
_ONE_LINE = str.maketrans(dict.fromkeys("\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029", " "))


def _one_line(text: str) -> str:
    return text.translate(_ONE_LINE)


def _escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _time(ms: int, separator: str) -> str:
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{separator}{millis:03d}"
