from __future__ import annotations

import dataclasses
import errno
import math
import os
import pathlib
import re
import shutil
import subprocess
import threading
import time
import wave

import imageio_ffmpeg
import numpy as np
import numpy.typing as npt
import pytest
from castad_contracts import brief, codes, events
from castad_runtime import outages
from castad_runtime.stage import cancellation, errors
from castad_video import ffmpeg, fonts, layers, provider, shots, slideshow
from PIL import Image, ImageChops

SONG_S = 4.0
SHORT_SIDE = 240
FPS = 6
FFMPEG = imageio_ffmpeg.get_ffmpeg_exe()
BRIEF = brief.Brief(customer_name="스테이 머뭄", region="군산", genre=brief.Style.KPOP.value, duration_s=4)
LYRICS = events.Lyrics(
    title="군산의 스테이 머뭄",
    language=brief.Language.KOREAN,
    sections=(
        events.LyricSection(kind="verse", lines=("군산에 노을이 내리면",)),
        events.LyricSection(kind="chorus", lines=("오늘도 스테이 머뭄에서",)),
    ),
)
TIMED = (
    events.TimedLine(text="군산에 노을이 내리면", start_s=0.5, end_s=2.2),
    events.TimedLine(text="오늘도 스테이 머뭄에서", start_s=2.2, end_s=3.8),
)


@dataclasses.dataclass(frozen=True)
class Probe:
    video_codec: str
    audio_codec: str
    width: int
    height: int
    duration_s: float


def probe(path: pathlib.Path) -> Probe:
    """What `ffmpeg -i` says about a file (imageio-ffmpeg ships no ffprobe)."""
    stderr = subprocess.run([FFMPEG, "-hide_banner", "-i", str(path)], capture_output=True, text=True).stderr
    hours, minutes, seconds = re.search(r"Duration: (\d+):(\d+):([\d.]+)", stderr).groups()  # type: ignore[union-attr]
    video = re.search(r"Video: (\w+).*?, (\d+)x(\d+)", stderr)
    audio = re.search(r"Audio: (\w+)", stderr)
    assert video is not None and audio is not None, stderr
    return Probe(
        video_codec=video.group(1),
        audio_codec=audio.group(1),
        width=int(video.group(2)),
        height=int(video.group(3)),
        duration_s=int(hours) * 3600 + int(minutes) * 60 + float(seconds),
    )


def frame_at(video: pathlib.Path, time_s: float, out: pathlib.Path) -> Image.Image:
    command = [FFMPEG, "-v", "error", "-y", "-ss", str(time_s), "-i", str(video), "-frames:v", "1", str(out)]
    subprocess.run(command, check=True, capture_output=True)
    return Image.open(out).convert("RGB")


def write_tone(path: pathlib.Path, seconds: float, sample_rate: int = 22050) -> None:
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    samples = (0.3 * np.sin(2 * math.pi * 440.0 * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(samples.tobytes())


@pytest.fixture(scope="module")
def song(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("song") / "song.wav"
    write_tone(path, SONG_S)
    return path


@pytest.fixture(scope="module")
def local() -> provider.LocalVideoProvider:
    return provider.LocalVideoProvider(short_side=SHORT_SIDE, fps=FPS)


@pytest.fixture(scope="module")
def rendered(
    local: provider.LocalVideoProvider, song: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[brief.Format, tuple[provider.Video, pathlib.Path]]:
    """The brief's video in every format, each rendered from the one song."""
    out_dir = tmp_path_factory.mktemp("video")
    videos = {}
    for shape in brief.Format:
        out = out_dir / f"{shape.slug}.mp4"
        cancel = cancellation.Cancellation()
        video = local.render(BRIEF, LYRICS, TIMED, song, out, seed="pipeline-1", cancel=cancel, shape=shape)
        videos[shape] = (video, out)
    return videos


def test_a_horizontal_video_is_16_by_9_h264_with_aac_audio(
    rendered: dict[brief.Format, tuple[provider.Video, pathlib.Path]],
) -> None:
    video, path = rendered[brief.Format.WIDE]

    found = probe(path)

    assert (found.video_codec, found.audio_codec) == ("h264", "aac")
    assert found.width * 9 == found.height * 16
    assert (found.width, found.height) == (video.width, video.height)
    assert found.width % 2 == 0 and found.height % 2 == 0


def test_a_vertical_video_is_9_by_16(rendered: dict[brief.Format, tuple[provider.Video, pathlib.Path]]) -> None:
    video, path = rendered[brief.Format.VERTICAL]

    found = probe(path)

    assert (found.video_codec, found.audio_codec) == ("h264", "aac")
    assert found.width * 16 == found.height * 9
    assert (found.width, found.height) == (video.width, video.height)
    assert found.width <= SHORT_SIDE and found.width % 2 == 0 and found.height % 2 == 0


def test_a_square_video_is_1_by_1_with_the_business_name_and_captions_inside_its_frame(
    rendered: dict[brief.Format, tuple[provider.Video, pathlib.Path]], tmp_path: pathlib.Path
) -> None:
    video, path = rendered[brief.Format.SQUARE]

    found = probe(path)
    title = np.asarray(frame_at(path, 0.2, tmp_path / "title.png").convert("L"), dtype=np.float64)

    assert (found.width, found.height) == (video.width, video.height) == (SHORT_SIDE // 18 * 18,) * 2
    # The title card is drawn for the square frame: its text stands in the middle, clear of the edges.
    rows = np.flatnonzero((np.abs(title - np.median(title)) > 60).mean(axis=1) > 0.02)
    assert rows.size and rows[0] > 0.1 * found.height and rows[-1] < 0.9 * found.height


@pytest.mark.parametrize("shape", list(brief.Format))
def test_the_video_lasts_as_long_as_the_song(
    rendered: dict[brief.Format, tuple[provider.Video, pathlib.Path]], shape: brief.Format
) -> None:
    video, path = rendered[shape]

    assert abs(probe(path).duration_s - SONG_S) < 0.25
    assert video.duration_s == pytest.approx(SONG_S)


def test_a_frame_shows_the_caption_sung_at_that_time(
    rendered: dict[brief.Format, tuple[provider.Video, pathlib.Path]], tmp_path: pathlib.Path
) -> None:
    _, path = rendered[brief.Format.VERTICAL]

    title = np.asarray(frame_at(path, 0.2, tmp_path / "title.png"), dtype=np.float64)
    verse = np.asarray(frame_at(path, 1.5, tmp_path / "verse.png"), dtype=np.float64)
    chorus = np.asarray(frame_at(path, 3.0, tmp_path / "chorus.png"), dtype=np.float64)

    assert verse.std() > 20
    assert np.mean(np.abs(verse - title)) > 2
    assert np.mean(np.abs(chorus - verse)) > 2


def ink(image: Image.Image, background: Image.Image) -> float:
    """Share of pixels that differ from the background."""
    difference = np.asarray(ImageChops.difference(image, background).convert("L"))
    return float(np.mean(difference > 40))


CAPTIONS = {
    brief.Language.KOREAN: "가나다",
    brief.Language.ENGLISH: "Hello",
    brief.Language.JAPANESE: "ひらがなカタカナ漢字",
    brief.Language.CHINESE: "海边书店",
}


@pytest.mark.parametrize("language", list(brief.Language))
def test_the_caption_renderer_draws_every_languages_glyphs_not_missing_glyph_boxes(language) -> None:
    font = fonts.find_font(language)
    renderer = layers.FrameRenderer(BRIEF, provider.frame_size(BRIEF.frames[0], 360), font, "s")

    background = renderer.background().convert("RGBA")
    empty, drawn, missing = (
        Image.alpha_composite(background, renderer.caption(text))
        for text in ("", CAPTIONS[language], "\uffff" * len(CAPTIONS[language]))
    )

    assert 0.005 < ink(drawn, empty) < 0.3
    assert ink(drawn, missing) > 0.005


@pytest.mark.parametrize("language", list(brief.Language))
def test_the_found_font_draws_the_language(language) -> None:
    assert fonts.draws(fonts.find_font(language), language)


def test_a_korean_only_font_is_not_taken_for_japanese_or_chinese() -> None:
    nanum = fonts.Font(pathlib.Path("/usr/share/fonts/truetype/nanum/NanumGothic.ttf"))
    assert fonts.draws(nanum, brief.Language.KOREAN)
    assert not fonts.draws(nanum, brief.Language.JAPANESE)
    assert not fonts.draws(nanum, brief.Language.CHINESE)
    assert fonts.find_font(brief.Language.JAPANESE, explicit=nanum.path) != nanum


def test_an_explicit_font_that_draws_the_language_is_used(tmp_path: pathlib.Path) -> None:
    explicit = fonts.find_font(brief.Language.KOREAN).path

    assert fonts.find_font(brief.Language.KOREAN, explicit).path == explicit


def test_an_explicit_font_that_does_not_exist_falls_back_to_an_installed_one(tmp_path: pathlib.Path) -> None:
    found = fonts.find_font(brief.Language.KOREAN, tmp_path / "missing.ttf")

    assert found.path.is_file() and fonts.draws(found, brief.Language.KOREAN)


def test_no_font_tells_how_to_install_one(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_a_font = tmp_path / "not-a-font.ttf"
    not_a_font.write_text("plain text")
    broken = (fonts.Font(not_a_font), fonts.Font(tmp_path / "absent.ttf"))
    monkeypatch.setattr(fonts, "KNOWN_FONTS", {language: broken for language in brief.Language})
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(fonts.FontNotFound, match="fonts-noto-cjk.*CASTAD_VIDEO_FONT_PATH"):
        fonts.find_font(brief.Language.CHINESE)


@pytest.mark.parametrize(
    ("shape", "short_side", "expected"),
    [
        (brief.Format.VERTICAL, 720, (720, 1280)),
        (brief.Format.WIDE, 720, (1280, 720)),
        (brief.Format.SQUARE, 720, (720, 720)),
        (brief.Format.VERTICAL, 240, (234, 416)),
        (brief.Format.WIDE, 1080, (1920, 1080)),
    ],
)
def test_frame_sizes_have_an_exact_aspect_and_even_sides(
    shape: brief.Format, short_side: int, expected: tuple[int, int]
) -> None:
    assert provider.frame_size(shape, short_side) == expected


def test_shots_start_with_the_title_card_and_last_as_long_as_the_song() -> None:
    plan = shots.shots(LYRICS, TIMED, SONG_S)

    assert [shot.text for shot in plan] == [None, *(line.text for line in TIMED)]
    assert [shot.chorus for shot in plan] == [False, False, True]
    assert sum(shot.duration_s for shot in plan) == pytest.approx(SONG_S)


def test_long_captions_wrap_within_the_frame() -> None:
    font = fonts.find_font(brief.Language.KOREAN).at(40)
    lines = layers.wrap("바다가 보이는 조용한 한옥 스테이에서 쉬어 가요", font, 300)

    assert len(lines) > 1
    assert all(font.getlength(line) <= 300 for line in lines)


def test_a_missing_song_is_a_permanent_error(local: provider.LocalVideoProvider, tmp_path: pathlib.Path) -> None:
    with pytest.raises(errors.PermanentProviderError) as raised:
        local.render(
            BRIEF,
            LYRICS,
            TIMED,
            tmp_path / "absent.wav",
            tmp_path / "out.mp4",
            seed="s",
            cancel=cancellation.Cancellation(),
        )

    assert raised.value.code == "song_missing"
    assert not raised.value.retryable


def test_an_ffmpeg_failure_is_a_permanent_error_with_its_stderr(
    local: provider.LocalVideoProvider, song: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    out = tmp_path / "no-such-directory" / "out.mp4"

    with pytest.raises(errors.PermanentProviderError) as raised:
        local.render(BRIEF, LYRICS, TIMED, song, out, seed="s", cancel=cancellation.Cancellation())

    assert raised.value.code == "render_failed"
    assert "no-such-directory" in raised.value.message


def with_fake_ffmpeg(tmp_path: pathlib.Path, script: str) -> provider.LocalVideoProvider:
    """A local provider whose ffmpeg is a shell script."""
    fake = tmp_path / "ffmpeg"
    fake.write_text(f"#!/bin/sh\n{script}\n", encoding="utf-8")
    fake.chmod(0o755)
    return provider.LocalVideoProvider(short_side=SHORT_SIDE, fps=FPS, ffmpeg=str(fake))


def render_with(
    renderer: provider.LocalVideoProvider, song: pathlib.Path, tmp_path: pathlib.Path, **kw: object
) -> None:
    cancel = kw.pop("cancel", None) or cancellation.Cancellation()
    renderer.render(BRIEF, LYRICS, TIMED, song, tmp_path / "out.mp4", seed="s", cancel=cancel)  # type: ignore[arg-type]


def test_a_cancelled_render_kills_its_ffmpeg_at_once(song: pathlib.Path, tmp_path: pathlib.Path) -> None:
    pid_file = tmp_path / "ffmpeg.pid"
    slow = with_fake_ffmpeg(tmp_path, f"echo $$ > '{pid_file}'\nexec sleep 60")
    cancel = cancellation.Cancellation()
    raised: list[BaseException] = []

    def render() -> None:
        try:
            render_with(slow, song, tmp_path, cancel=cancel)
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=render)
    thread.start()
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text(encoding="utf-8").strip():
        assert time.monotonic() < deadline, "ffmpeg never started"
        time.sleep(0.02)
    started = time.monotonic()
    cancel.cancel(cancellation.Reason.TIMEOUT)
    thread.join(10)

    assert time.monotonic() - started < 5
    assert [type(error) for error in raised] == [cancellation.Cancelled]
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text(encoding="utf-8")), 0)


def test_ffmpeg_runs_in_a_session_of_its_own_so_a_stop_signal_to_the_service_misses_it(
    song: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    ids = tmp_path / "ids"
    renderer = with_fake_ffmpeg(tmp_path, f"echo $$ $(cut -d' ' -f6 /proc/$$/stat) > '{ids}'")

    render_with(renderer, song, tmp_path)

    pid, session = map(int, ids.read_text(encoding="utf-8").split())
    assert session == pid != os.getsid(0)


def test_an_ffmpeg_killed_by_a_signal_fails_the_render_retryably(song: pathlib.Path, tmp_path: pathlib.Path) -> None:
    renderer = with_fake_ffmpeg(tmp_path, "echo 'out of memory, probably' >&2\nkill -9 $$")

    with pytest.raises(errors.RetryableProviderError) as raised:
        render_with(renderer, song, tmp_path)

    assert raised.value.code == "render_interrupted"
    assert "SIGKILL" in raised.value.message


def test_an_ffmpeg_out_of_disk_is_an_outage_not_a_failed_render(song: pathlib.Path, tmp_path: pathlib.Path) -> None:
    renderer = with_fake_ffmpeg(tmp_path, "echo 'out.mp4: No space left on device' >&2\nexit 1")

    with pytest.raises(OSError) as raised:
        render_with(renderer, song, tmp_path)

    assert raised.value.errno == errno.ENOSPC
    assert outages.is_resource_shortage(raised.value)


def test_a_song_that_is_not_a_wav_is_a_permanent_error(
    local: provider.LocalVideoProvider, tmp_path: pathlib.Path
) -> None:
    broken = tmp_path / "song.wav"
    broken.write_bytes(b"not a wav")

    with pytest.raises(errors.PermanentProviderError) as raised:
        local.render(BRIEF, LYRICS, TIMED, broken, tmp_path / "out.mp4", seed="s", cancel=cancellation.Cancellation())

    assert raised.value.code == "song_unreadable"


def test_a_music_apis_mp3_song_is_rendered_for_as_long_as_it_lasts(
    local: provider.LocalVideoProvider, tmp_path: pathlib.Path
) -> None:
    """A song from a music API comes as an MP3: the local renderer reads its length and its audio as well."""
    song = tmp_path / "song.mp3"
    subprocess.run(
        [imageio_ffmpeg.get_ffmpeg_exe(), "-nostdin", "-loglevel", "error", "-f", "lavfi", "-i",
         "sine=frequency=440:duration=2.5", "-c:a", "libmp3lame", str(song)],
        check=True,
    )  # fmt: skip
    out = tmp_path / "out.mp4"

    video = local.render(BRIEF, LYRICS, TIMED, song, out, seed="s", cancel=cancellation.Cancellation())

    assert video.duration_s == pytest.approx(2.5, abs=0.1)
    assert abs(probe(out).duration_s - 2.5) < 0.25 and probe(out).audio_codec == "aac"


def test_a_file_that_is_no_audio_is_a_permanent_error(
    local: provider.LocalVideoProvider, tmp_path: pathlib.Path
) -> None:
    broken = tmp_path / "song.mp3"
    broken.write_bytes(b"ID3 but nothing after")

    with pytest.raises(errors.PermanentProviderError) as raised:
        local.render(BRIEF, LYRICS, TIMED, broken, tmp_path / "out.mp4", seed="s", cancel=cancellation.Cancellation())

    assert raised.value.code == "song_unreadable"


SUNG = (
    events.TimedLine(
        text="군산에 노을",
        start_s=0.6,
        end_s=1.9,
        syllables=tuple(
            events.TimedSyllable(text=char, at=at, start_s=round(0.6 + 0.26 * n, 2), end_s=round(0.86 + 0.26 * n, 2))
            for n, (at, char) in enumerate((at, char) for at, char in enumerate("군산에 노을") if char != " ")
        ),
    ),
    events.TimedLine(
        text="오늘도",
        start_s=2.3,
        end_s=3.5,
        syllables=tuple(
            events.TimedSyllable(text=char, at=n, start_s=2.3 + 0.4 * n, end_s=2.7 + 0.4 * n)
            for n, char in enumerate("오늘도")
        ),
    ),
)


def test_karaoke_captions_change_on_screen_within_a_fifth_of_a_second_of_each_sung_syllable(
    song: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    fps, side = 24, 360
    renderer = provider.LocalVideoProvider(short_side=side, fps=fps)
    out = tmp_path / "karaoke.mp4"
    renderer.render(BRIEF, LYRICS, SUNG, song, out, seed="s", cancel=cancellation.Cancellation())
    width, height = provider.frame_size(BRIEF.frames[0], side)
    raw = subprocess.run(
        [FFMPEG, "-v", "error", "-i", str(out), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        check=True,
    ).stdout
    frames = np.frombuffer(raw, dtype=np.uint8).reshape(-1, height, width, 3).astype(np.float64)
    plan = shots.shots(LYRICS, SUNG, SONG_S)
    stills = layers.FrameRenderer(BRIEF, (width, height), renderer.fonts[LYRICS.language], "s")
    background = stills.background().convert("RGBA")
    drawn = [
        stills.title_card(LYRICS.title) if shot.text is None else stills.caption(shot.text, shot.chorus, shot.sung)
        for shot in plan
    ]
    expected = [np.asarray(Image.alpha_composite(background, layer).convert("RGB"), np.float64) for layer in drawn]

    # Which planned still each decoded frame shows, by the nearest picture.
    band = slice(int(0.4 * height), int(0.72 * height))  # where the caption is drawn
    shown = [int(np.argmin([np.mean(np.abs(frame[band] - still[band])) for still in expected])) for frame in frames]
    first_seen = {index: shown.index(index) / fps for index in set(shown)}
    planned_starts = np.cumsum([0.0] + [shot.duration_s for shot in plan[:-1]])

    assert len(plan) == 1 + sum(len(line.syllables) for line in SUNG)
    assert set(first_seen) == set(range(len(plan)))
    for index, start in enumerate(planned_starts):
        assert abs(first_seen[index] - start) <= 0.2, (plan[index], first_seen[index], start)
    sung_starts = [syllable.start_s for line in SUNG for syllable in line.syllables]
    assert list(planned_starts[1:]) == pytest.approx(sung_starts)


def test_captions_change_only_with_the_lyrics_whatever_the_photos() -> None:
    plan = shots.shots(LYRICS, TIMED, SONG_S)

    starts = [sum(shot.duration_s for shot in plan[:number]) for number in range(len(plan))]
    assert starts == pytest.approx([0.0, TIMED[0].start_s, TIMED[1].start_s])


def test_each_photo_comes_on_at_the_bar_line_nearest_the_end_of_an_equal_part() -> None:
    bars = [2.03 * number for number in range(15)]  # 118 bpm in 4/4

    cuts = slideshow.photo_cuts(30.0, 5, bars)

    # Parts of 6 s end at 6, 12, 18 and 24: the nearest bars are at 6.09, 12.18, 18.27 and 24.36.
    assert cuts == pytest.approx([6.09, 12.18, 18.27, 24.36])


def test_without_bars_the_photos_change_at_sung_lines_and_with_neither_at_equal_parts() -> None:
    assert slideshow.photo_cuts(10.0, 1, [1.0, 2.0]) == []
    assert slideshow.photo_cuts(10.0, 2, []) == [5.0]
    # Parts of 2 s: a line sung within 1 s of a part's end starts the next photo; none near 6 or 8 (9.9 is too late).
    assert slideshow.photo_cuts(10.0, 5, [0.1, 2.4, 3.6, 9.9]) == pytest.approx([2.4, 3.6, 6.0, 8.0])
    # 3.05 is near 4.0 but would leave the photo from 2.95 on for less than half a second.
    cuts = slideshow.photo_cuts(10.0, 5, [2.95, 3.05])
    assert cuts == pytest.approx([2.95, 4.0, 6.0, 8.0])
    assert all(later - earlier >= 0.5 for earlier, later in zip([0.0, *cuts], cuts, strict=False))


def test_a_photo_comes_on_from_the_first_frame_at_or_after_its_cut() -> None:
    # At 12 fps frames start every 1/12 s: a cut at 2.03 s is shown from frame 25 (2.083 s), one at 2.5 s from
    # frame 30 exactly, and the last photo lasts until the frame before 4.0 s.
    assert slideshow.frame_counts([2.03, 2.5], 4.0, 12) == [25, 5, 18]
    assert slideshow.frame_counts([], 4.0, 12) == [48]


def detailed_object(centre: tuple[float, float], size: tuple[int, int] = (400, 300)) -> Image.Image:
    """A soft gradient with fine grain, and a small checkered object whose middle is at `centre` (fractions)."""
    rng = np.random.default_rng(7)
    rows = np.linspace(60.0, 200.0, size[1])[:, None]
    pixels = np.broadcast_to(rows, (size[1], size[0])) + rng.normal(0.0, 3.0, (size[1], size[0]))
    x, y, half = round(centre[0] * size[0]), round(centre[1] * size[1]), 30
    checks = (np.add.outer(np.arange(2 * half) // 6, np.arange(2 * half) // 6) % 2) * 255.0
    pixels[y - half : y + half, x - half : x + half] = checks
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).convert("RGB")


def test_the_centre_of_interest_is_where_the_detail_is() -> None:
    x, y = slideshow.centre_of_interest(detailed_object((0.7, 0.35)))

    assert (x, y) == pytest.approx((0.7, 0.35), abs=0.04)


def test_the_centre_of_interest_keeps_away_from_the_borders_and_a_plain_photo_is_looked_at_in_its_middle() -> None:
    assert slideshow.centre_of_interest(detailed_object((0.9, 0.12))) == pytest.approx((0.8, 0.2), abs=0.01)
    assert slideshow.centre_of_interest(Image.new("RGB", (300, 200), (90, 140, 200))) == (0.5, 0.5)


def test_a_photo_is_cropped_to_the_frame_around_its_centre_of_interest() -> None:
    photo = detailed_object((0.75, 0.5), (800, 300))  # wide: a vertical frame takes a narrow slice of it

    drawn = slideshow.canvas(photo, (90, 160))

    assert drawn.image.size == slideshow.canvas_size((90, 160))
    assert drawn.image.width * 160 == pytest.approx(drawn.image.height * 90, rel=0.01)
    # The slice (169 px of 800) is centred on the object at x = 600, so the checks fill the canvas's middle.
    middle = np.asarray(drawn.image.convert("L"), float)[:, drawn.image.width // 3 : 2 * drawn.image.width // 3]
    assert middle.std() > 60
    assert slideshow.crop_box((800, 300), (90, 160), (0.75, 0.5)) == pytest.approx((515.6, 0.0, 684.4, 300.0), abs=0.1)
    assert drawn.end == pytest.approx((0.5, 0.5), abs=0.03)  # already in the middle: the window zooms straight in
    # A photo of the frame's shape is kept whole; the window drifts towards the object as far as it stays inside.
    whole = slideshow.canvas(detailed_object((0.7, 0.3), (360, 640)), (90, 160))
    assert whole.end == pytest.approx((0.5 + 0.5 - 0.5 / slideshow.ZOOM, 0.5 / slideshow.ZOOM))


def two_photos(directory: pathlib.Path) -> list[pathlib.Path]:
    """A photo with a red left half and a green right one, and one of blue and yellow stripes."""
    halves = Image.new("RGB", (300, 400), (220, 40, 40))
    halves.paste((40, 200, 60), (150, 0, 300, 400))
    stripes = Image.new("RGB", (400, 300), (40, 60, 220))
    for top in range(0, 300, 60):
        stripes.paste((240, 220, 40), (0, top, 400, top + 30))
    paths = [directory / "halves.jpg", directory / "stripes.png"]
    halves.save(paths[0])
    stripes.save(paths[1])
    return paths


def as_shown(photo: pathlib.Path, size: tuple[int, int], progress: float = 0.0) -> npt.NDArray[np.float64]:
    """The photo as the slideshow shows it `progress` (0 to 1) of the way through its time.

    Cropped around its centre of interest, zoomed from 1 to ZOOM with the window's centre moving straight to the
    drift's end, shaded for the captions.
    """
    drawn = slideshow.canvas(Image.open(photo).convert("RGB"), size)
    zoom = 1 + (slideshow.ZOOM - 1) * progress
    width, height = drawn.image.size
    x = width * (0.5 + (drawn.end[0] - 0.5) * progress)
    y = height * (0.5 + (drawn.end[1] - 0.5) * progress)
    box = (x - width / zoom / 2, y - height / zoom / 2, x + width / zoom / 2, y + height / zoom / 2)
    view = drawn.image.resize(size, Image.Resampling.BILINEAR, box=box).convert("RGBA")
    return np.asarray(Image.alpha_composite(view, layers.scrim(size)).convert("RGB"), dtype=np.float64)


def decoded(video: pathlib.Path, size: tuple[int, int]) -> npt.NDArray[np.float64]:
    """Every frame of the video, as RGB."""
    raw = subprocess.run(
        [FFMPEG, "-v", "error", "-i", str(video), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True,
        check=True,
    ).stdout
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, size[1], size[0], 3).astype(np.float64)


def test_a_video_with_photos_shows_each_in_turn_under_the_captions_cut_on_a_bar(
    song: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    fps = 12
    photos = two_photos(tmp_path)
    out = tmp_path / "slideshow.mp4"
    bars = (0.0, 1.9, 3.8)  # the cut nearest the middle of the song is on the bar at 1.9 s, not at 2.0 s

    video = provider.LocalVideoProvider(short_side=SHORT_SIDE, fps=fps).render(
        BRIEF, LYRICS, TIMED, song, out, seed="p", cancel=cancellation.Cancellation(), photos=photos, bars_s=bars
    )

    size = (video.width, video.height)
    frames = decoded(out, size)
    cut = math.ceil(1.9 * fps)  # the first frame at or after the bar
    spans = [(0, cut), (cut, len(frames))]
    band = slice(int(0.3 * video.height), int(0.75 * video.height))  # where the caption is drawn
    rows = np.r_[int(0.2 * video.height) : band.start, band.stop : video.height]  # below the name, off the caption
    for number, frame in enumerate(frames):
        shown = next(photo for photo, (first, end) in enumerate(spans) if first <= number < end)
        first, end = spans[shown]
        progress = (number - first) / (end - first - 1)
        views = [as_shown(path, size, progress) for path in photos]
        distances = [float(np.mean(np.abs(frame[rows] - view[rows]))) for view in views]
        # The frame is the photo due then, as far zoomed and moved as it should be by then.
        assert distances[shown] < 10 < 30 < distances[1 - shown], (number, distances)
        if number % fps == 0:  # the caption's ink is over the photo
            assert np.mean(np.abs(frame[band] - views[shown][band]) > 60) > 0.01, number
    # By its end the striped photo is zoomed in: its stripes have moved from where they were at first.
    last, unzoomed = frames[-1][rows], as_shown(photos[1], size)[rows]
    assert np.mean(np.abs(last - as_shown(photos[1], size, 1.0)[rows])) < np.mean(np.abs(last - unzoomed)) - 10


def test_a_photo_that_does_not_decode_fails_the_render_for_good(
    local: provider.LocalVideoProvider, song: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff not a photo")

    with pytest.raises(errors.PermanentProviderError) as raised:
        local.render(
            BRIEF,
            LYRICS,
            TIMED,
            song,
            tmp_path / "out.mp4",
            seed="p",
            cancel=cancellation.Cancellation(),
            photos=[broken],
        )
    assert raised.value.code == "photo_unreadable"


def test_a_large_photo_is_held_only_as_large_as_it_takes_to_fill_the_frame(tmp_path: pathlib.Path) -> None:
    large = tmp_path / "large.jpg"
    Image.new("RGB", (4000, 3000), (90, 120, 200)).save(large)

    held = provider._read_photo(large, (240, 426))

    assert held.height >= 426 and held.width >= 240
    assert held.size == pytest.approx((568, 426), abs=2)  # 4:3 covering a 240 x 426 frame


def test_the_title_card_shows_the_business_and_its_region_in_the_middle() -> None:
    size = provider.frame_size(BRIEF.frames[0], 360)
    font = fonts.find_font(brief.Language.KOREAN)

    def middle(source: brief.Brief) -> Image.Image:
        renderer = layers.FrameRenderer(source, size, font, "s", photos=True)
        card = Image.alpha_composite(Image.new("RGBA", size, (120, 120, 120, 255)), renderer.title_card("노래"))
        return card.crop((0, size[1] // 4, size[0], 3 * size[1] // 4)).convert("RGB")

    plain = Image.new("RGB", (size[0], size[1] // 2), (120, 120, 120))
    card = middle(BRIEF)
    assert ink(card, plain) > 0.03
    assert ink(middle(BRIEF.model_copy(update={"customer_name": "바다 책방"})), card) > 0.01
    assert ink(middle(BRIEF.model_copy(update={"region": "부산 해운대"})), card) > 0.01


def test_an_encode_that_stalls_is_killed_and_run_once_more_and_a_second_stall_is_retryable(monkeypatch):
    """ffmpeg's pipeline can stop for good: an encode past its time is killed and run again, twice at most."""
    runs: list[float | None] = []
    done = subprocess.CompletedProcess(["ffmpeg"], 0, "", "")

    def stalls_once(command, timeout_s=None):
        runs.append(timeout_s)
        if len(runs) == 1:
            raise subprocess.TimeoutExpired(command, timeout_s)
        return done

    cancel = cancellation.Cancellation()
    monkeypatch.setattr(cancel, "run", stalls_once)
    assert ffmpeg.run_encode(["ffmpeg"], 30.0, cancel) is done
    assert runs == [300.0, 300.0]  # ten seconds a second of video

    def stalls(command, timeout_s=None):
        raise subprocess.TimeoutExpired(command, timeout_s)

    monkeypatch.setattr(cancel, "run", stalls)
    with pytest.raises(errors.RetryableProviderError) as raised:
        ffmpeg.run_encode(["ffmpeg"], 3.0, cancel)
    assert raised.value.code == codes.ErrorCode.RENDER_INTERRUPTED and "120 s, 2 times" in raised.value.message


def read_back(frame: Image.Image, folder: pathlib.Path) -> list[str]:
    """The lines Debian's tesseract reads in the frame's white text (the business's name: the style's text colour).

    The text is taken apart from what is behind it (white only, black on white), as a reader's eye does."""
    tesseract = shutil.which("tesseract")
    if tesseract is None:
        pytest.fail("Debian's tesseract-ocr is missing: run `make setup` as root (or apt-get install tesseract-ocr)")
    pixels = np.asarray(frame.convert("RGB"), dtype=np.int16)
    ink = pixels.min(axis=2) > 215
    page = folder / "page.png"
    Image.fromarray(np.where(ink, 0, 255).astype(np.uint8)).save(page)
    read = subprocess.run([tesseract, str(page), "-", "-l", "eng", "--psm", "11"], capture_output=True, text=True)
    assert read.returncode == 0, read.stderr
    return [line.strip() for line in read.stdout.splitlines() if line.strip()]


def test_the_business_name_is_legible_in_every_formats_first_seconds_over_a_photo(
    local: provider.LocalVideoProvider, song: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Read back from the frames by OCR: drawn for each frame, over the photo, not cut by its edges.

    A Latin name: tesseract misreads Hangul this small (a 240-pixel short side) one syllable in three."""
    named = BRIEF.model_copy(update={"customer_name": "Cafe Blue", "language": brief.Language.ENGLISH})
    photos = two_photos(tmp_path)
    for shape in brief.Format:
        out = tmp_path / f"{shape.slug}.mp4"
        local.render(
            named, LYRICS, TIMED, song, out, seed="s", cancel=cancellation.Cancellation(), photos=photos, shape=shape
        )

        lines = read_back(frame_at(out, 0.3, tmp_path / f"{shape.slug}.png"), tmp_path)

        assert "Cafe Blue" in lines, (shape, lines)


def test_a_brands_font_draws_the_captions_where_it_draws_the_language_and_the_languages_own_elsewhere(
    local: provider.LocalVideoProvider,
) -> None:
    branded = BRIEF.model_copy(update={"brand": brief.Brand(colors=("#102030",), font=brief.FontFamily.NANUM_MYEONGJO)})
    serif = branded.model_copy(update={"brand": brief.Brand(colors=("#102030",), font=brief.FontFamily.NOTO_SERIF_CJK)})

    assert local.font_for(branded, brief.Language.KOREAN).path.name == "NanumMyeongjoBold.ttf"
    assert local.font_for(branded, brief.Language.JAPANESE) == local.fonts[brief.Language.JAPANESE]  # no kana
    assert local.font_for(serif, brief.Language.JAPANESE) == fonts.Font(fonts.FAMILY_FILES[serif.brand.font][0], 0)
    assert local.font_for(BRIEF, brief.Language.KOREAN) == local.fonts[brief.Language.KOREAN]  # no brand


def test_a_brands_caption_style_puts_the_sung_line_lower_and_larger(local: provider.LocalVideoProvider) -> None:
    font = local.fonts[brief.Language.KOREAN]
    size = provider.frame_size(brief.Format.VERTICAL, 360)
    styled = {"position": "bottom", "size": "large"}
    drawn = {}
    for name, brand in (("plain", None), ("styled", {"colors": ["#102030"], "caption_style": styled})):
        source = BRIEF.model_validate({**BRIEF.model_dump(mode="json"), "brand": brand})
        renderer = layers.FrameRenderer(source, size, font, "s")
        layer = np.asarray(renderer.caption("바다 책방에서 만나요"))[..., 3] > 0  # its drawn pixels
        header = np.asarray(renderer.caption(""))[..., 3] > 0
        drawn[name] = np.argwhere(layer & ~header)
    plain, styled_rows = drawn["plain"][:, 0], drawn["styled"][:, 0]
    assert styled_rows.mean() > plain.mean() + 0.15 * size[1]  # lower in the frame
    assert np.ptp(styled_rows) > np.ptp(plain)  # and taller letters


@pytest.mark.parametrize("shape", list(brief.Format))
def test_a_low_caption_keeps_clear_of_the_logo_in_every_format(local: provider.LocalVideoProvider, shape) -> None:
    size = provider.frame_size(shape, 360)
    logo = Image.new("RGBA", (64, 64), (230, 0, 200, 255))
    styled = {"colors": ["#102030"], "caption_style": {"position": "bottom", "size": "large"}}
    source = BRIEF.model_validate({**BRIEF.model_dump(mode="json"), "brand": styled})
    renderer = layers.FrameRenderer(source, size, local.fonts[brief.Language.KOREAN], "s", logo=logo)

    layer = np.asarray(renderer.caption("속초 바닷가 작은 책방에서 파도 소리 들으며 만나요"))
    header = np.asarray(renderer.caption(""))

    caption = (layer[..., 3] > 0) & (np.abs(layer.astype(int) - header.astype(int)).max(axis=2) > 0)
    magenta = (np.abs(header[..., :3].astype(int) - [230, 0, 200]).max(axis=2) < 10) & (header[..., 3] > 0)
    rows, cols = np.nonzero(magenta)
    assert rows.size, "the logo is drawn"
    box = caption[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    assert caption.any() and not box.any()  # nothing of the caption over the logo
