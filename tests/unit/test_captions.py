"""The song's sung lines as caption files: SubRip and WebVTT, timed as sung, syllable by syllable in WebVTT."""

from __future__ import annotations

import re

from castad_api import captions
from castad_contracts import events

CUE_TIMES = re.compile(r"^(\d\d):(\d\d):(\d\d)[,.](\d{3}) --> (\d\d):(\d\d):(\d\d)[,.](\d{3})$", re.MULTILINE)


def line(text: str, start_s: float, end_s: float, *syllables: tuple[str, int, float]) -> events.TimedLine:
    """A sung line; each syllable (its characters, their offset, when it begins) lasts until the next one."""
    ends = [*(begins for _, _, begins in syllables[1:]), end_s][: len(syllables)]
    return events.TimedLine(
        text=text,
        start_s=start_s,
        end_s=end_s,
        syllables=tuple(
            events.TimedSyllable(text=chars, at=at, start_s=begins, end_s=end)
            for (chars, at, begins), end in zip(syllables, ends, strict=True)
        ),
    )


BREAD = line("Fresh bread & <coffee>", 1.0, 3.5, ("Fresh", 0, 1.0), ("bread", 6, 1.5), ("", 11, 2.0), ("cof", 15, 2.2))
KOREAN = line("군산 한 시간", 3661.25, 3663.0, ("군", 0, 3661.25), ("산", 1, 3661.6), ("한", 3, 3662.0))


def seconds(found: tuple[str, ...]) -> tuple[float, float]:
    h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, found)
    return h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000


def test_a_subrip_file_has_a_numbered_cue_per_sung_line_timed_as_it_is_sung():
    written = captions.srt([BREAD, KOREAN])

    assert written == (
        "1\n00:00:01,000 --> 00:00:03,500\nFresh bread & <coffee>\n\n2\n01:01:01,250 --> 01:01:03,000\n군산 한 시간\n\n"
    )
    assert [seconds(found) for found in CUE_TIMES.findall(written)] == [(1.0, 3.5), (3661.25, 3663.0)]


def test_a_webvtt_file_times_each_syllable_after_the_first_inside_its_cue_and_escapes_the_text():
    written = captions.webvtt([BREAD, KOREAN])

    assert written == (
        "WEBVTT\n\n"
        "1\n00:00:01.000 --> 00:00:03.500\n"
        "Fresh <00:00:01.500>bread &amp; &lt;<00:00:02.200>coffee&gt;\n\n"  # the empty syllable sings on: no tag
        "2\n01:01:01.250 --> 01:01:03.000\n군<01:01:01.600>산 <01:01:02.000>한 시간\n\n"
    )


def test_a_line_without_words_or_time_is_no_cue_and_breaks_inside_a_line_cannot_end_its_cue():
    broken = line("Come\nto -->\r\nGunsan", 5.0, 7.0, ("Come", 0, 5.0), ("to", 5, 5.5), ("Gun", 13, 6.0))
    lines = [line("   ", 0.0, 1.0), line("Too short", 2.0, 2.0), broken]

    assert captions.srt(lines) == "1\n00:00:05,000 --> 00:00:07,000\nCome to ->  Gunsan\n\n"
    assert captions.webvtt(lines) == (
        "WEBVTT\n\n1\n00:00:05.000 --> 00:00:07.000\nCome <00:00:05.500>to --&gt;  <00:00:06.000>Gunsan\n\n"
    )


def test_a_syllable_timed_outside_its_cue_or_out_of_order_gets_no_tag():
    odd = line(
        "one two three four",
        10.0,
        12.0,
        ("one", 0, 10.0),
        ("two", 4, 9.0),  # before the cue began
        ("three", 8, 11.0),
        ("four", 14, 10.5),  # before the syllable before it
    )
    late = line("five", 12.0, 13.0, ("five", 0, 13.5))  # after the cue ended

    assert captions.webvtt([odd, late]).splitlines()[4:] == [
        "one two <00:00:11.000>three four",
        "",
        "2",
        "00:00:12.000 --> 00:00:13.000",
        "five",
        "",
    ]


def test_no_lines_make_an_empty_subrip_file_and_a_webvtt_file_with_its_header_alone():
    assert captions.srt([]) == ""
    assert captions.webvtt([]) == "WEBVTT\n\n"
