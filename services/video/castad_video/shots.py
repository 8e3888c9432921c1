"""When each caption layer is on screen: the title card until the singing starts, then each line as it is sung."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from castad_contracts import events


@dataclasses.dataclass(frozen=True)
class Shot:
    """One caption layer on screen: a lyric line, or the title card when text is None.

    `sung` is how many characters of the caption have been sung (karaoke), None when not known.
    """

    text: str | None
    chorus: bool
    duration_s: float
    sung: int | None = None


def shots(lyrics: events.Lyrics, timed_lines: Sequence[events.TimedLine], duration_s: float) -> list[Shot]:
    """The title card until the first line, then each line until the next one starts; sums to duration_s.

    A line whose syllables are timed is shown once per syllable, each time with what has been sung
    so far highlighted (from the syllable's start).
    """
    chorus_lines = {line for section in lyrics.sections if section.kind == "chorus" for line in section.lines}
    starts: list[tuple[float, str | None, int | None]] = [(0.0, None, None)]
    for line in timed_lines:
        moments: list[tuple[float, int | None]] = [(line.start_s, None)] if not line.syllables else []
        moments += [(syllable.start_s, syllable.at + len(syllable.text)) for syllable in line.syllables]
        for time, sung in moments:
            start = min(max(time, starts[-1][0]), duration_s)
            starts.append((start, line.text, sung))
    ends = [start for start, _, _ in starts[1:]] + [duration_s]
    return [
        Shot(text, text in chorus_lines, end - start, sung)
        for (start, text, sung), end in zip(starts, ends, strict=True)
        if end - start > 1e-3
    ]


def poster_moment(plan: Sequence[Shot]) -> float:
    """The middle of the title card (the business's name, its region and the song's title over the first photo).

    The start of the video if the singing begins at once, with no title card shown.
    """
    if not plan or plan[0].text is not None:
        return 0.0
    return plan[0].duration_s / 2
