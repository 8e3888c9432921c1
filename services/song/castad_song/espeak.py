"""Speak phrases with eSpeak NG and tell when each of their phonemes starts.

The speaking happens in a child process (castad_song.speaker), one per song, run through the
attempt's cancellation so that a cancelled song stops at once.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

PACKAGE = "Debian's espeak-ng (libespeak-ng1 and espeak-ng-data); `make setup` installs it"
TIMEOUT_S = 120.0

Run = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class EspeakMissing(RuntimeError):
    """The eSpeak NG library, or a voice of it, is not installed."""


class EspeakFailed(RuntimeError):
    """eSpeak NG did not speak (its process failed)."""


@dataclasses.dataclass(frozen=True)
class Phoneme:
    name: str
    start_s: float


@dataclasses.dataclass(frozen=True)
class Speech:
    samples: npt.NDArray[np.float64]
    sample_rate: int
    phonemes: tuple[Phoneme, ...]


def run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def _command(arguments: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "castad_song.speaker", *arguments]


def _answers(result: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    answers = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    for answer in answers:
        if "error" in answer:
            raise EspeakMissing(f"{answer['error']}: install {PACKAGE}")
    if result.returncode != 0:
        raise EspeakFailed(f"eSpeak NG exited with {result.returncode}: {result.stderr.strip()[-500:]}")
    return answers


def missing_voices(voices: Sequence[str], run: Run = run) -> list[str]:
    """Which of these eSpeak NG voices are not installed; raises EspeakMissing without eSpeak NG at all."""
    [answer] = _answers(run(_command(["--check", *voices])))
    missing = answer["missing"]
    assert isinstance(missing, list)
    return [str(name) for name in missing]


def speak(phrases: Sequence[tuple[str, str]], run: Run = run) -> list[Speech]:
    """Speak each (voice, text) (where `[[...]]` holds phonemes) with `run` (the attempt's `cancel.run`).

    The library can crash on a run of phrases it speaks well one by one (Debian 12's 1.51 does, on some
    English lines holding Hangul words, from the seventh phrase on): then each is spoken by a process of its own.
    """
    if not phrases:
        return []
    result = run(_command([json.dumps(list(phrases), ensure_ascii=False)]))
    if result.returncode < 0 and len(phrases) > 1:  # killed by a signal: the library crashed
        log.warning("eSpeak NG crashed (signal %d) on %d phrases: each alone", -result.returncode, len(phrases))
        return [speech for phrase in phrases for speech in speak([phrase], run)]
    answers = _answers(result)
    if len(answers) != len(phrases):
        raise EspeakFailed(f"eSpeak NG spoke {len(answers)} of {len(phrases)} phrases")
    spoken = []
    for answer in answers:
        pcm = np.frombuffer(base64.b64decode(str(answer["samples"])), dtype="<i2")
        timed = answer["phonemes"]
        assert isinstance(timed, list)
        phonemes = tuple(Phoneme(str(name), float(start)) for name, start in timed)
        spoken.append(Speech(pcm.astype(np.float64) / 32768.0, int(str(answer["rate"])), phonemes))
    return spoken
