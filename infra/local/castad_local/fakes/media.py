"""Sample media the fakes serve: an MP3 tone, a short MP4 and a cover JPEG, made once per process with ffmpeg.

Each file is encoded on first use into a temporary directory (removed at exit) and kept in
memory, so a fake answering many downloads runs ffmpeg once per kind. ffmpeg is the one on
PATH, else the binary imageio-ffmpeg ships; without either the first use fails saying so.
"""

from __future__ import annotations

import atexit
import functools
import pathlib
import shutil
import subprocess
import tempfile
import threading

TONE_HZ = 440
VOLUME = 0.2  # a soft tone
SAMPLE_RATE = 44_100
VIDEO_SIZE = (360, 640)
VIDEO_S = 2.0
VIDEO_COLOUR = "0x2d6a8f"
HTML_PAGE = b"<!doctype html><title>Not Found</title><h1>Not Found</h1>"  # served where media was expected

_lock = threading.Lock()
_made: dict[str, bytes] = {}


class MediaError(RuntimeError):
    """ffmpeg is missing or failed."""


@functools.cache
def ffmpeg() -> str:
    """The ffmpeg binary: on PATH, else imageio-ffmpeg's."""
    found = shutil.which("ffmpeg")
    if found:
        return found
    try:
        import imageio_ffmpeg

        return str(imageio_ffmpeg.get_ffmpeg_exe())
    except (ImportError, RuntimeError) as error:
        raise MediaError(
            "the fake providers need ffmpeg to make sample media: install it (apt-get install ffmpeg) "
            f"or the imageio-ffmpeg package ({error})"
        ) from error


@functools.cache
def _folder() -> pathlib.Path:
    folder = pathlib.Path(tempfile.mkdtemp(prefix="castad-fake-media-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def mp3(seconds: float) -> bytes:
    """An MP3 of a soft sine tone, `seconds` long, 44.1 kHz mono (libmp3lame)."""
    tone = f"sine=frequency={TONE_HZ}:sample_rate={SAMPLE_RATE}:duration={seconds}"
    options = ["-f", "lavfi", "-i", tone, "-af", f"volume={VOLUME}", "-ac", "1", "-c:a", "libmp3lame", "-b:a", "64k"]
    return _made_once(f"tone-{seconds}s.mp3", options)


def mp4() -> bytes:
    """A 2 s 360x640 MP4 of a plain colour: H.264 yuv420p with an AAC tone."""
    width, height = VIDEO_SIZE
    colour = f"color=c={VIDEO_COLOUR}:s={width}x{height}:r=30:d={VIDEO_S}"
    tone = f"sine=frequency={TONE_HZ}:sample_rate={SAMPLE_RATE}:duration={VIDEO_S}"
    video = ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p"]
    audio = ["-af", f"volume={VOLUME}", "-c:a", "aac", "-b:a", "64k"]
    options = ["-f", "lavfi", "-i", colour, "-f", "lavfi", "-i", tone, *video, *audio, "-movflags", "+faststart"]
    return _made_once("plain.mp4", [*options, "-shortest"])


def jpeg() -> bytes:
    """A 360x360 JPEG of a plain colour (a cover image)."""
    width, _ = VIDEO_SIZE
    return _made_once(
        "cover.jpeg", ["-f", "lavfi", "-i", f"color=c={VIDEO_COLOUR}:s={width}x{width}", "-frames:v", "1"]
    )


def _made_once(name: str, options: list[str]) -> bytes:
    with _lock:
        if name not in _made:
            out = _folder() / name
            command = [ffmpeg(), "-nostdin", "-hide_banner", "-loglevel", "error", "-y", *options, str(out)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise MediaError(f"ffmpeg could not make {name}: {done.stderr.strip()}")
            _made[name] = out.read_bytes()
        return _made[name]
