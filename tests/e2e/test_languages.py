"""The seeds' request fields in each of the four languages, with free-text genres, end to end.

Every service its own process, each brief sung in its language (the one end-to-end test with a voice) to a
finished video whose captions are drawn in a font that has the language's glyphs (a frame of each is kept in the
test's folder to look at), and to caption files, SubRip and WebVTT, timed as the song stage sang its lines.
"""

from __future__ import annotations

import html
import re

import pytest
from castad_contracts import brief, envelope, events
from PIL import Image, ImageChops, ImageStat

from tests.e2e.conftest import Databases, RunningCastad
from tests.unit.test_captions import CUE_TIMES, seconds
from tests.unit.test_video_provider import frame_at, probe

pytestmark = pytest.mark.e2e

BRIEFS = {
    brief.Language.KOREAN: brief.Brief(
        customer_name="스테이 머뭄",
        region="군산",
        detail_region_info="군산 신흥동 말랭이 마을에 있는 한옥 독채 숙소",
        language=brief.Language.KOREAN,
        genre="pop, ambient",
        duration_s=6,
    ),
    brief.Language.ENGLISH: brief.Brief(
        customer_name="Stay Meomum",
        region="Gunsan",
        detail_region_info="A private hanok stay in Malraengi village, Sinheung-dong",
        language=brief.Language.ENGLISH,
        genre="acoustic folk",
        duration_s=6,
    ),
    brief.Language.JAPANESE: brief.Brief(
        customer_name="ステイ・モムム",
        region="群山",
        detail_region_info="新興洞マルレンイ村にある韓屋の一棟貸し宿",
        language=brief.Language.JAPANESE,
        genre="lo-fi, chill",
        duration_s=6,
        orientation=brief.Orientation.HORIZONTAL,
    ),
    brief.Language.CHINESE: brief.Brief(
        customer_name="住在慕姆",
        region="群山",
        detail_region_info="位于新兴洞村庄的韩屋独栋民宿",
        language=brief.Language.CHINESE,
        genre="jazz, lounge",
        duration_s=6,
    ),
}


@pytest.mark.timeout(180)
def test_each_language_gives_a_finished_video_with_its_captions_drawn(castad, tmp_path):
    running = castad({"CASTAD_VIDEO_SHORT_SIDE": "360", "CASTAD_SONG_VOICE": "female"})  # sung, in each language
    ids = {language: running.submit(source) for language, source in BRIEFS.items()}

    views = running.wait_terminal(list(ids.values()), timeout_s=150)

    for language, pipeline_id in ids.items():
        view = views[pipeline_id]
        assert view.status == "SUCCEEDED", (language, view.error_code, view.error_message)
        assert view.brief.genre == BRIEFS[language].genre  # kept as written
        video = tmp_path / f"{language.value}.mp4"
        video.write_bytes(running.http.get(f"/v1/pipelines/{pipeline_id}/artifacts/video").content)
        found = probe(video)
        assert (found.video_codec, found.audio_codec) == ("h264", "aac")
        title, caption = (frame_at(video, t, tmp_path / f"{language.value}-{t}.png") for t in (0.2, 4.0))
        # A caption frame differs from the title card where its text is drawn, in the middle of the frame.
        assert _ink(title, caption) > 0.003, f"no caption drawn for {language}"
        _captions_follow_the_song(running, pipeline_id, language)


def _captions_follow_the_song(running: RunningCastad, pipeline_id: str, language: brief.Language) -> None:
    """The caption files cue each line the song stage said it sang, within 0.1 s, and WebVTT its syllables."""
    dbs = Databases(running.installation.database_urls)
    try:
        [told] = [
            row["envelope"]
            for row in dbs.outbox_of("song", pipeline_id)
            if row["routing_key"].endswith("song.completed")
        ]
    finally:
        dbs.close()
    song = envelope.Envelope.model_validate(told).payload()
    assert isinstance(song, events.SongCompleted)
    sung = [(line.text, line.start_s, line.end_s) for line in song.timed_lines if line.text.strip()]
    for form in ("srt", "vtt"):
        served = running.http.get(f"/v1/pipelines/{pipeline_id}/artifacts/song/captions.{form}")
        assert served.status_code == 200, (language, served.text)
        cues = [seconds(found) for found in CUE_TIMES.findall(served.text)]
        assert len(cues) == len(sung) > 0, language
        for (text, start, end), (cue_start, cue_end) in zip(sung, cues, strict=True):
            assert abs(cue_start - start) < 0.1 and abs(cue_end - end) < 0.1, (language, form, text)
        shown = html.unescape(re.sub(r"<[^>]*>", "", served.text))  # the text without WebVTT's syllable tags
        assert all(text.strip() in shown for text, _, _ in sung), (language, form, shown)
    assert "<00:00:" in served.text, f"no syllable timed in the WebVTT file of {language}"


def _ink(first: Image.Image, second: Image.Image) -> float:
    width, height = first.size
    box = (0, height // 4, width, 3 * height // 4)
    difference = (
        ImageChops.difference(first.crop(box), second.crop(box)).convert("L").point(lambda v: 255 if v > 40 else 0)
    )
    return ImageStat.Stat(difference).mean[0] / 255
