"""How each genre sounds: its tempo, scale, chord progression, drum patterns and the timbres of its lead and pad."""

from __future__ import annotations

import dataclasses

from castad_contracts import brief


@dataclasses.dataclass(frozen=True)
class Timbre:
    """Additive synthesis recipe: harmonic amplitudes, exponential decay per second, vibrato."""

    harmonics: tuple[float, ...]
    decay: float = 0.0
    vibrato_semitones: float = 0.0
    vibrato_hz: float = 5.0
    attack_s: float = 0.012
    release_s: float = 0.05


@dataclasses.dataclass(frozen=True)
class Style:
    """How a genre sounds. Patterns are 16 steps per bar, `x` marks a hit."""

    bpm: float
    scale: tuple[int, ...]
    progression: tuple[tuple[int, ...], ...]
    steps_per_beat: int
    swing: float
    kick: str
    snare: str
    hat: str
    bass: str
    chords: str
    lead: Timbre
    pad: Timbre
    walking_bass: bool = False


_MAJOR = (0, 2, 4, 5, 7, 9, 11)
_MINOR = (0, 2, 3, 5, 7, 8, 10)
_YONANUKI_MINOR = (0, 2, 3, 7, 8)
BASS = Timbre((1.0, 0.45, 0.12), decay=1.2, release_s=0.04)  # every genre's bass
_PAD = Timbre((1.0, 0.3, 0.1), decay=0.5, attack_s=0.04, release_s=0.2)

STYLES: dict[brief.Style, Style] = {
    brief.Style.KPOP: Style(
        bpm=118,
        scale=_MAJOR,
        progression=((0, 4, 7), (7, 11, 14), (9, 12, 16), (5, 9, 12)),
        steps_per_beat=2,
        swing=0.0,
        kick="x...x...x...x...",
        snare="....x.......x...",
        hat="x.x.x.x.x.x.x.x.",
        bass="x.x.x.x.x.x.x.x.",
        chords="x.......x.......",
        lead=Timbre((1.0, 0.45, 0.3, 0.18, 0.1), vibrato_semitones=0.15, vibrato_hz=5.5),
        pad=_PAD,
    ),
    brief.Style.BALLAD: Style(
        bpm=68,
        scale=_MAJOR,
        progression=((0, 4, 7), (9, 12, 16), (5, 9, 12), (7, 11, 14)),
        steps_per_beat=2,
        swing=0.0,
        kick="x.......x.......",
        snare="........x.......",
        hat="x...x...x...x...",
        bass="x.......x.......",
        chords="x...............",
        lead=Timbre((1.0, 0.25, 0.08), vibrato_semitones=0.25, attack_s=0.03, release_s=0.12),
        pad=Timbre((1.0, 0.2, 0.05), decay=0.3, attack_s=0.15, release_s=0.4),
    ),
    brief.Style.HIPHOP: Style(
        bpm=92,
        scale=_MINOR,
        progression=((0, 3, 7), (8, 12, 15), (3, 7, 10), (10, 14, 17)),
        steps_per_beat=4,
        swing=0.0,
        kick="x.....x...x.....",
        snare="....x.......x...",
        hat="xxxxxxxxxxxxxxxx",
        bass="x.....x...x.....",
        chords="x.......x.......",
        lead=Timbre((1.0, 0.0, 0.33, 0.0, 0.2, 0.0, 0.14), decay=2.5, release_s=0.03),
        pad=_PAD,
    ),
    brief.Style.ROCK: Style(
        bpm=132,
        scale=_MAJOR,
        progression=((0, 4, 7), (5, 9, 12), (7, 11, 14), (5, 9, 12)),
        steps_per_beat=2,
        swing=0.0,
        kick="x.x.....x.x.....",
        snare="....x.......x...",
        hat="x.x.x.x.x.x.x.x.",
        bass="x.x.x.x.x.x.x.x.",
        chords="x...x...x...x...",
        lead=Timbre((1.0, 0.7, 0.5, 0.35, 0.25, 0.15), vibrato_semitones=0.2, vibrato_hz=6.0),
        pad=Timbre((1.0, 0.8, 0.6, 0.4, 0.3), decay=1.0),
    ),
    brief.Style.JAZZ: Style(
        bpm=112,
        scale=_MAJOR,
        progression=((2, 5, 9, 12), (7, 11, 14, 17), (0, 4, 7, 11), (9, 12, 16, 19)),
        steps_per_beat=2,
        swing=1 / 3,
        kick="x.......x.......",
        snare="....x.......x...",
        hat="x...x.x.x...x.x.",
        bass="x...x...x...x...",
        chords="x.....x.........",
        lead=Timbre((1.0, 0.5, 0.15, 0.05), vibrato_semitones=0.3, vibrato_hz=4.5),
        pad=Timbre((1.0, 0.2, 0.05, 0.0, 0.0, 0.05), decay=1.5),
        walking_bass=True,
    ),
    brief.Style.TROT: Style(
        bpm=130,
        scale=_YONANUKI_MINOR,
        progression=((0, 3, 7), (5, 8, 12), (7, 11, 14), (0, 3, 7)),
        steps_per_beat=2,
        swing=0.0,
        kick="x.......x.......",
        snare="....x.......x...",
        hat="..x...x...x...x.",
        bass="x...x...x...x...",
        chords="..x...x...x...x.",
        lead=Timbre((1.0, 0.55, 0.3, 0.15), vibrato_semitones=0.6, vibrato_hz=6.5),
        pad=Timbre((1.0, 0.5, 0.25), decay=6.0),
    ),
    brief.Style.ACOUSTIC: Style(
        bpm=96,
        scale=_MAJOR,
        progression=((0, 4, 7), (5, 9, 12), (9, 12, 16), (7, 11, 14)),
        steps_per_beat=2,
        swing=0.0,
        kick="x.......x.......",
        snare="....x.......x...",
        hat="..x...x...x...x.",
        bass="x.......x.......",
        chords="x...x.x...x.x...",
        lead=Timbre((1.0, 0.6, 0.3, 0.15, 0.08), decay=0.8, vibrato_semitones=0.1),
        pad=Timbre((1.0, 0.7, 0.4, 0.25, 0.12), decay=4.0),
    ),
}


def tempo_bpm(style: brief.Style) -> float:
    return STYLES[style].bpm
