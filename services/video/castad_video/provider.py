"""Video providers: caption a song with its lyrics and encode an MP4.

The local provider composes what castad_video.layers draws over the photos' slideshow (castad_video.slideshow) or a
gradient, on the times of castad_video.shots, and has ffmpeg encode it (castad_video.ffmpeg).
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import tempfile
from collections.abc import Sequence
from typing import Protocol

import imageio_ffmpeg
from castad_contracts import brief, codes, events
from castad_runtime.stage import cancellation, errors
from PIL import Image

from castad_video import ffmpeg, fonts, layers, shots, slideshow

log = logging.getLogger(__name__)


class VideoProvider(Protocol):
    def frame(self, shape: brief.Format) -> tuple[int, int]:
        """The (width, height) of its videos in `shape`."""
        ...

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
        photos: Sequence[pathlib.Path] = (),
        bars_s: Sequence[float] = (),
        shape: brief.Format | None = None,
        logo: pathlib.Path | None = None,
    ) -> Video:
        """The video in `shape` (default: the brief's first format), laid out for that frame, in the brief's brand.

        `logo`: the file of the brand's logo."""
        ...


@dataclasses.dataclass(frozen=True)
class Video:
    width: int
    height: int
    duration_s: float
    poster_s: float = 0.0  # when the video shows what its poster should: the business's name over the first photo


def frame_size(shape: brief.Format, short_side: int) -> tuple[int, int]:
    """(width, height) with an exact 9:16, 1:1 or 16:9 aspect and even sides, short side rounded down to 18k."""
    unit = max(short_side // 18, 1)
    short, long = 18 * unit, 32 * unit
    return {brief.Format.VERTICAL: (short, long), brief.Format.SQUARE: (short, short)}.get(shape, (long, short))


def _concat_list(plan: Sequence[shots.Shot], frames: Sequence[pathlib.Path]) -> str:
    entries = [f"file '{frame.name}'\nduration {shot.duration_s:.6f}" for shot, frame in zip(plan, frames, strict=True)]
    # The concat demuxer ignores the last duration unless the last file is listed once more.
    return "\n".join(["ffconcat version 1.0", *entries, f"file '{frames[-1].name}'", ""])


@dataclasses.dataclass(frozen=True)
class Backdrop:
    """A still behind the captions for `frames` frames.

    A photo's canvas whose window drifts to `end`, or the gradient (`end` None), which stands still.
    """

    path: pathlib.Path
    end: tuple[float, float] | None
    frames: int


class LocalVideoProvider:
    """Draws the captions with Pillow and has ffmpeg move over the photos and encode them with the song.

    The photos are a slideshow (castad_video.slideshow): each cropped around its centre of interest, slowly
    zoomed towards it by ffmpeg's zoompan, one after the other on the song's bars. The captions are transparent
    layers, one per change, laid over the moving photos by ffmpeg (so Python draws a still per caption, not a
    frame per frame). Without photos a gradient of the style's colours stays behind the captions.

    ffmpeg runs through the attempt's cancellation: in a session of its own (a stop signal
    sent to the service's process group does not reach it) and killed as soon as the
    attempt is cancelled (timed out, the service stopping, the claim lost). An ffmpeg killed
    by a signal it was not sent by the attempt (the kernel's out-of-memory killer, an
    operator) fails the render retryably; a full disk is an outage, not the render's fault.
    """

    def __init__(
        self,
        short_side: int = 720,
        fps: int = 24,
        font_path: pathlib.Path | None = None,
        ffmpeg: str | None = None,
    ) -> None:
        self._short_side = short_side
        self._fps = fps
        # A service that cannot draw every language's captions does not start (FontNotFound).
        self.fonts = {language: fonts.find_font(language, font_path) for language in brief.Language}
        self._family_fonts: dict[tuple[brief.FontFamily, brief.Language], fonts.Font | None] = {}
        self._ffmpeg = ffmpeg or imageio_ffmpeg.get_ffmpeg_exe()

    def frame(self, shape: brief.Format) -> tuple[int, int]:
        return frame_size(shape, self._short_side)

    def font_for(self, source: brief.Brief, language: brief.Language) -> fonts.Font:
        """The brand's font for the language if it draws it, else the language's own."""
        family = source.brand.font if source.brand is not None else None
        if family is not None and (key := (family, language)) not in self._family_fonts:
            self._family_fonts[key] = fonts.family_font(family, language)
        chosen = self._family_fonts.get((family, language)) if family is not None else None
        if family is not None and chosen is None:
            log.info(
                "the brand's font %s does not draw %s: the captions use %s",
                family,
                language,
                self.fonts[language].path.name,
            )
        return chosen or self.fonts[language]

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
        photos: Sequence[pathlib.Path] = (),
        bars_s: Sequence[float] = (),
        shape: brief.Format | None = None,
        logo: pathlib.Path | None = None,
    ) -> Video:
        """The video of the song with the lyrics as captions, over the photos or a gradient, in `shape`.

        Over `photos` in turn (a slideshow cut on the bars of `bars_s`, else on sung lines) or, without any, over a
        gradient of the style's colours. Every layer is drawn for the frame of `shape` (default: the brief's first
        format), each photo framed for it: no format is cropped from another.
        """
        duration = ffmpeg.song_duration(song_path, self._ffmpeg)
        size = self.frame(shape or brief.frames[0])
        font = self.font_for(brief, lyrics.language)
        shown = None if logo is None else _read_logo(logo, max(round(layers.LOGO_SIDE * min(size)), 1))
        renderer = layers.FrameRenderer(brief, size, font, seed, photos=bool(photos), logo=shown)
        plan = shots.shots(lyrics, timed_lines, duration)
        moments = bars_s or [line.start_s for line in timed_lines]
        counts = slideshow.frame_counts(slideshow.photo_cuts(duration, len(photos), moments), duration, self._fps)
        with tempfile.TemporaryDirectory(prefix="castad-video-") as workdir:
            folder = pathlib.Path(workdir)
            drawn = self._write_layers(renderer, lyrics.title, plan, folder, cancel)
            listing = folder / "layers.ffconcat"
            listing.write_text(_concat_list(plan, drawn), encoding="utf-8")
            if photos:
                backgrounds = self._write_canvases(photos, counts, size, folder, cancel)
            else:
                still = folder / "background.png"
                renderer.background().save(still, compress_level=1)
                backgrounds = [Backdrop(still, None, slideshow.first_frame(duration, self._fps))]
            self._encode(listing, backgrounds, song_path, out_path, size, duration, cancel)
        return Video(width=size[0], height=size[1], duration_s=duration, poster_s=shots.poster_moment(plan))

    @staticmethod
    def _write_layers(
        renderer: layers.FrameRenderer,
        title: str,
        plan: Sequence[shots.Shot],
        workdir: pathlib.Path,
        cancel: cancellation.Cancellation,
    ) -> list[pathlib.Path]:
        written: dict[tuple[str | None, bool, int | None], pathlib.Path] = {}
        files: list[pathlib.Path] = []
        for shot in plan:
            key = (shot.text, shot.chorus, shot.sung)
            if key not in written:
                cancel.check()
                path = workdir / f"layer-{len(written):04d}.png"
                image = (
                    renderer.title_card(title)
                    if shot.text is None
                    else renderer.caption(shot.text, shot.chorus, shot.sung)
                )
                image.save(path, compress_level=1)
                written[key] = path
            files.append(written[key])
        return files

    @staticmethod
    def _write_canvases(
        photos: Sequence[pathlib.Path],
        counts: Sequence[int],
        size: tuple[int, int],
        workdir: pathlib.Path,
        cancel: cancellation.Cancellation,
    ) -> list[Backdrop]:
        """Each photo shown (on for a frame or more) as its canvas, with where its drift ends and its frames."""
        canvases: list[Backdrop] = []
        for number, (photo, frames) in enumerate(zip(photos, counts, strict=True)):
            if frames == 0:
                continue
            cancel.check()
            drawn = slideshow.canvas(_read_photo(photo, slideshow.canvas_size(size)), size)
            path = workdir / f"canvas-{number:02d}.png"
            drawn.image.save(path, compress_level=1)
            canvases.append(Backdrop(path, drawn.end, frames))
        return canvases

    def _encode(
        self,
        listing: pathlib.Path,
        backgrounds: Sequence[Backdrop],
        song_path: pathlib.Path,
        out_path: pathlib.Path,
        size: tuple[int, int],
        duration: float,
        cancel: cancellation.Cancellation,
    ) -> None:
        inputs = ["-f", "concat", "-safe", "0", "-i", str(listing)]
        parts = []
        for number, backdrop in enumerate(backgrounds, start=1):
            if backdrop.end is None:
                inputs += ["-i", str(backdrop.path)]
                # The decoded frame repeated (`-loop 1` would decode the picture again for every frame).
                motion = f"loop=loop={backdrop.frames - 1}:size=1,setpts=N/({self._fps}*TB)"
            else:
                inputs += ["-i", str(backdrop.path)]
                motion = slideshow.zoompan(backdrop.end, backdrop.frames, size, self._fps)
            parts.append(f"[{number}:v]{motion},setsar=1[p{number}]")
        joined = "".join(f"[p{number}]" for number in range(1, len(backgrounds) + 1))
        graph = ";".join(
            [
                *parts,
                f"{joined}concat=n={len(backgrounds)}:v=1:a=0,format=yuv420p[background]",
                "[background][0:v]overlay=eof_action=repeat,format=yuv420p[video]",
            ]
        )
        command = [
            self._ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
            *inputs,
            "-t", f"{duration:.3f}", "-i", str(song_path),
            "-filter_complex", graph,
            "-map", "[video]", "-map", f"{len(backgrounds) + 1}:a:0", "-r", str(self._fps),
            "-frames:v", str(slideshow.first_frame(duration, self._fps)),
            "-c:v", "libx264", "-preset", "veryfast",
            "-c:a", "aac", "-b:a", "128k",
            "-movflags", "+faststart", "-f", "mp4", str(out_path),
        ]  # fmt: skip
        ffmpeg.check_render(ffmpeg.run_encode(command, duration, cancel))


def _read_photo(path: pathlib.Path, canvas: tuple[int, int]) -> Image.Image:
    """A photo of the brief, decoded no larger than it needs to be to fill the canvas.

    Twenty large photos held whole would take gigabytes. The gateway kept it only once it decoded; its bytes were
    checked since.
    """
    try:
        with Image.open(path) as photo:
            scale = max(canvas[0] / photo.width, canvas[1] / photo.height)
            needed = (max(round(photo.width * scale), canvas[0]), max(round(photo.height * scale), canvas[1]))
            photo.draft("RGB", needed)  # a JPEG decodes at a fraction of its size when that is enough
            picture = photo.convert("RGB")
        picture.thumbnail((max(needed[0], 1), max(needed[1], 1)), Image.Resampling.LANCZOS)
        return picture
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise errors.PermanentProviderError(
            codes.ErrorCode.PHOTO_UNREADABLE, f"{path.name} does not decode: {error}"
        ) from None


def _read_logo(path: pathlib.Path, box: int) -> Image.Image:
    """The brand's logo, its transparency kept, fitted in a `box` pixels square."""
    try:
        with Image.open(path) as opened:
            opened.draft("RGBA", (box, box))
            logo = opened.convert("RGBA")
        logo.thumbnail((box, box), Image.Resampling.LANCZOS)
        return logo
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise errors.PermanentProviderError(
            codes.ErrorCode.PHOTO_UNREADABLE, f"the brand's logo does not decode: {error}"
        ) from None
