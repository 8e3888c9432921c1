"""The instant video provider: a tiny ready-made MP4 at once, so benchmarks measure everything around it."""

from __future__ import annotations

import pathlib
import subprocess
import tempfile
from collections.abc import Sequence

import imageio_ffmpeg
from castad_contracts import brief, events
from castad_runtime.stage import cancellation

from castad_video import ffmpeg, provider

SHORT_SIDE = 18  # 18x32 or 32x18 pixels
CLIP_S = 1.0


class InstantVideoProvider:
    """A one-second black clip with silent audio, encoded once per format at start-up.

    H.264 video and AAC audio, in the format asked for.

    A job reads the song's length (so a missing or broken song still fails as it would
    with the local provider) and writes the prepared bytes.
    """

    def __init__(self, ffmpeg: str | None = None) -> None:
        self._ffmpeg = ffmpeg or imageio_ffmpeg.get_ffmpeg_exe()
        self._clips = {shape: self._encode(shape) for shape in brief.Format}

    def frame(self, shape: brief.Format) -> tuple[int, int]:
        return provider.frame_size(shape, SHORT_SIDE)

    def render(
        self,
        brief: brief.Brief,
        lyrics: events.Lyrics,
        timed_lines: Sequence[events.TimedLine],
        song_path: pathlib.Path,
        out_path: pathlib.Path,
        seed: str,
        *,
        cancel: cancellation.Cancellation,
        photos: Sequence[pathlib.Path] = (),  # the prepared clip shows none
        bars_s: Sequence[float] = (),
        shape: brief.Format | None = None,
        logo: pathlib.Path | None = None,  # nor a brand
    ) -> provider.Video:
        ffmpeg.song_duration(song_path)
        shape = shape or brief.frames[0]
        width, height = self.frame(shape)
        out_path.write_bytes(self._clips[shape])
        return provider.Video(width=width, height=height, duration_s=CLIP_S, poster_s=CLIP_S / 2)

    def _encode(self, shape: brief.Format) -> bytes:
        width, height = provider.frame_size(shape, SHORT_SIDE)
        with tempfile.TemporaryDirectory(prefix="castad-instant-") as workdir:
            out = pathlib.Path(workdir) / "clip.mp4"
            command = [
                self._ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
                "-f", "lavfi", "-i", f"color=c=black:s={width}x{height}:r=1:d={CLIP_S}",
                "-f", "lavfi", "-i", f"anullsrc=r=8000:cl=mono:d={CLIP_S}",
                "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest",
                "-movflags", "+faststart", "-f", "mp4", str(out),
            ]  # fmt: skip
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise RuntimeError(f"{self._ffmpeg} could not encode the instant clip: {result.stderr.strip()}")
            return out.read_bytes()
