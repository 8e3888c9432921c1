"""What a song costs the song stage's local provider.

CPU seconds (its own process and eSpeak NG's) per ten seconds of song, sung by each voice in each language and
played without a voice.

Each song is the local lyric provider's lyrics for one brief per language, composed once to warm up and then
timed `ROUNDS` times; the median goes to docs/reports/song.md, written by bench/templates/song.md.j2 from the
measurements kept in song.json (`make bench-song`; `--render` writes the page again from them). The budget the singing
voice was built to: about a second of CPU per ten seconds sung, a tenth of that without a voice.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import platform
import resource
import statistics
import tempfile
import time
from typing import Any

from castad_contracts import brief
from castad_lyric import provider as lyric_provider
from castad_runtime.stage import cancellation
from castad_song import provider
from castad_testkit import machine

from bench import pages

ROUNDS = 3
DURATION_S = 30
VOICES = ("female", "male", None)
BUDGET_SUNG_S = 1.0  # CPU seconds per ten seconds of song
BUDGET_INSTRUMENTAL_S = 0.33


def cpu_s() -> float:
    """CPU time of this process and of its children that ended (eSpeak NG speaks in one per song)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def per_ten_seconds(language: brief.Language, singer: str | None, scratch: pathlib.Path) -> float:
    source = brief.Brief(customer_name="스테이 머뭄", region="군산", language=language, duration_s=DURATION_S)
    lyrics = lyric_provider.LocalLyricProvider().write(source, seed="bench")
    composer = provider.LocalSongProvider(singer=singer)
    cancel = cancellation.Cancellation()
    composer.compose(source, lyrics, scratch / "warm-up.wav", seed="bench", cancel=cancel)
    spent = []
    for _ in range(ROUNDS):
        started = cpu_s()
        composer.compose(source, lyrics, scratch / "song.wav", seed="bench", cancel=cancel)
        spent.append(cpu_s() - started)
    return statistics.median(spent) * 10 / DURATION_S


def render(measured: dict[str, Any]) -> str:
    """Return the page, written by bench/templates/song.md.j2 from the measurements, each song beside its budget."""
    budgets = measured["budgets"]
    songs = [
        {**song, "budget": budgets["instrumental_s" if song["voice"] == "none" else "sung_s"]}
        for song in measured["songs"]
    ]
    return pages.render("song.md.j2", **{**measured, "songs": songs})


def measure() -> dict[str, Any]:
    """Sing ten seconds in every language and voice; return the CPU each took, as the page is written from."""
    songs = []
    with tempfile.TemporaryDirectory() as folder:
        for language in brief.Language:
            for singer in VOICES:
                seconds = per_ten_seconds(language, singer, pathlib.Path(folder))
                songs.append({"language": language.value, "voice": singer or "none", "cpu_s": seconds})
                print(f"{language.value:9} {singer or 'none':7} {seconds:.2f} s of CPU per 10 s", flush=True)
    return {
        "facts": {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cores": os.cpu_count(),
            "cpu": machine.cpu_model(),
            "python": platform.python_version(),
        },
        "duration_s": DURATION_S,
        "rounds": ROUNDS,
        "budgets": {"sung_s": BUDGET_SUNG_S, "instrumental_s": BUDGET_INSTRUMENTAL_S},
        "songs": songs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = pages.arguments("song", __doc__)
    args = parser.parse_args(argv)
    pages.write(args.output, render, None if args.render else measure())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
