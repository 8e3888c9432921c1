"""ffmpeg as the local video runs it: the song's length read, an encode given its time, a still taken.

Its exit is turned into the render's outcome: killed by a signal the attempt did not send (the kernel's
out-of-memory killer, an operator) is retryable, a full disk is an outage, anything else fails the render for good.
"""

from __future__ import annotations

import errno
import logging
import pathlib
import re
import signal
import subprocess
import wave
from collections.abc import Sequence

import imageio_ffmpeg
from castad_contracts import codes
from castad_runtime import outages
from castad_runtime.stage import cancellation, errors

log = logging.getLogger(__name__)

STDERR_TAIL_LINES = 12
# The length is cut where each stream is read or made (the song's `-t` as an input option, the video's frame
# count), never by an output `-t`: ffmpeg 9's threaded pipeline then holds both streams in one sync queue, and
# on busy cores it stopped for good, every thread waiting on another, within a few encodes of 3 s videos (none in
# 800 encodes without it). Should it stop for any other reason, an encode is given ENCODE_S_PER_S of wall time a
# second of video (at least ENCODE_MIN_S; a 30 s video took 21-73 s on two busy cores), then killed and run once
# more.
ENCODE_S_PER_S = 10.0
ENCODE_MIN_S = 120.0
ENCODE_TRIES = 2


def run_encode(
    command: Sequence[str], duration: float, cancel: cancellation.Cancellation
) -> subprocess.CompletedProcess[str]:
    """Run ffmpeg's `command`, the encode of a `duration` s video, killed and run once more if not ended in time.

    Not ending in time is a stalled pipeline; a second stall is the render's retryable failure.
    """
    limit_s = max(ENCODE_MIN_S, ENCODE_S_PER_S * duration)
    for _ in range(ENCODE_TRIES):
        try:
            return cancel.run(command, timeout_s=limit_s)
        except subprocess.TimeoutExpired:
            log.warning("ffmpeg had not ended a %.1f s video in %.0f s: killed", duration, limit_s)
        except OSError as error:
            if outages.is_resource_shortage(error):
                raise  # no memory or processes left to start ffmpeg: the machine's failure, not the render's
            raise errors.PermanentProviderError(
                codes.ErrorCode.RENDER_FAILED, f"cannot run {command[0]}: {error}"
            ) from error
    raise errors.RetryableProviderError(
        codes.ErrorCode.RENDER_INTERRUPTED, f"ffmpeg had not ended in {limit_s:.0f} s, {ENCODE_TRIES} times"
    )


def still(
    video: pathlib.Path,
    at_s: float,
    out_path: pathlib.Path,
    cancel: cancellation.Cancellation,
    ffmpeg: str | None = None,
) -> None:
    """The frame of `video` shown at `at_s`, as a JPEG of the video's size (its poster)."""
    command = [
        ffmpeg or imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
        "-ss", f"{at_s:.3f}", "-i", str(video), "-frames:v", "1", "-q:v", "3", "-f", "image2", str(out_path),
    ]  # fmt: skip
    try:
        done = cancel.run(command, timeout_s=ENCODE_MIN_S)
    except subprocess.TimeoutExpired:
        raise errors.RetryableProviderError(
            codes.ErrorCode.RENDER_INTERRUPTED, f"ffmpeg took a still of the video for more than {ENCODE_MIN_S:g} s"
        ) from None
    check_render(done)
    if not out_path.exists() or out_path.stat().st_size == 0:
        raise errors.PermanentProviderError(codes.ErrorCode.RENDER_FAILED, f"no frame of the video at {at_s:.3f} s")


def song_duration(song_path: pathlib.Path, ffmpeg: str | None = None) -> float:
    """Seconds of the song: a WAV's from its header, any other audio's (a music API's MP3) as ffmpeg reads it."""
    if not song_path.is_file():
        raise errors.PermanentProviderError(codes.ErrorCode.SONG_MISSING, f"no song file at {song_path}")
    with song_path.open("rb") as head:
        riff = head.read(4) == b"RIFF"
    if riff or ffmpeg is None:
        try:
            with wave.open(str(song_path), "rb") as song:
                duration = song.getnframes() / song.getframerate()
        except (wave.Error, EOFError) as error:
            raise errors.PermanentProviderError(
                codes.ErrorCode.SONG_UNREADABLE, f"{song_path} is not a WAV file: {error}"
            ) from error
    else:
        duration = _probed_duration(song_path, ffmpeg)
    if duration <= 0:
        raise errors.PermanentProviderError(codes.ErrorCode.SONG_UNREADABLE, f"{song_path} holds no audio")
    return duration


FFMPEG_DURATION = re.compile(r"Duration: (\d+):(\d\d):(\d\d(?:\.\d+)?)")


def _probed_duration(song_path: pathlib.Path, ffmpeg: str) -> float:
    """The duration ffmpeg reads off an audio file's header (`ffmpeg -i` with no output prints it, then fails)."""
    try:
        result = subprocess.run(
            [ffmpeg, "-nostdin", "-hide_banner", "-i", str(song_path)], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        raise errors.RetryableProviderError(
            codes.ErrorCode.RENDER_FAILED, f"ffmpeg did not read {song_path} in 30 s"
        ) from None
    found = FFMPEG_DURATION.search(result.stderr)
    if found is None or "Audio:" not in result.stderr:
        raise errors.PermanentProviderError(codes.ErrorCode.SONG_UNREADABLE, f"{song_path} is no audio ffmpeg reads")
    hours, minutes, seconds = found.groups()
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def check_render(result: subprocess.CompletedProcess[str]) -> None:
    """Turn ffmpeg's exit into the render's outcome (a cancelled render never gets here)."""
    if result.returncode == 0:
        return
    tail = "\n".join(result.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])
    if result.returncode < 0 or result.returncode in (128 + signal.SIGKILL, 128 + signal.SIGTERM):
        name = signal.Signals(abs(result.returncode) % 128).name
        raise errors.RetryableProviderError(
            codes.ErrorCode.RENDER_INTERRUPTED, f"ffmpeg was killed by {name}. {tail}".strip()
        )
    if "No space left on device" in result.stderr or "Disk quota exceeded" in result.stderr:
        raise OSError(errno.ENOSPC, f"ffmpeg ran out of disk: {tail}")
    raise errors.PermanentProviderError(
        codes.ErrorCode.RENDER_FAILED, tail or f"ffmpeg exited with {result.returncode}"
    )
