"""The seeds' request fields in each of the four languages, with free-text genres, end to end.

Every service its own process, each brief sung in its language (the one end-to-end test with a voice) to a
finished video whose captions are drawn in a font that has the language's glyphs (a frame of each is kept in the
test's folder to look at).
"""

from __future__ import annotations

import pytest
from castad_contracts import brief
from PIL import Image, ImageChops, ImageStat

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


def _ink(first: Image.Image, second: Image.Image) -> float:
    width, height = first.size
    box = (0, height // 4, width, 3 * height // 4)
    difference = (
        ImageChops.difference(first.crop(box), second.crop(box)).convert("L").point(lambda v: 255 if v > 40 else 0)
    )
    return ImageStat.Stat(difference).mean[0] / 255
