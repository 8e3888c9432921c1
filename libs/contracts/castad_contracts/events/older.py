"""The earlier versions of the events that carry a brief or lyrics, which the versions after read as they are."""

from __future__ import annotations

from castad_contracts import brief as brief_
from castad_contracts.events.lyrics import Lyrics
from castad_contracts.events.requested import PipelineRequestedV6
from castad_contracts.events.stages import LyricCompleted, SongCompleted, SongCompletedV2, VideoCompletedV4

# Before a brief named formats (pipeline.requested up to v5, lyric.completed up to v6, song.completed up to v7,
# video.completed up to v8) each pipeline made one video, in the orientation's format; the versions after read each
# such brief as asking for that one.
BriefV5 = brief_.BriefV5


class PipelineRequestedV5(PipelineRequestedV6):
    brief: BriefV5  # type: ignore[assignment]


class LyricCompletedV6(LyricCompleted):
    brief: BriefV5  # type: ignore[assignment]


class SongCompletedV7(SongCompleted):
    brief: BriefV5  # type: ignore[assignment]


# Before the gateway sealed the photos (pipeline.requested and lyric.completed up to v4, song.completed up to v5,
# video.completed up to v5) a brief named them unsealed; the versions after read each such photo as one without a
# seal, which a video stage that checks seals uses only for a job begun before its cut-off
# (castad_video.service.checked_photos).
BriefV4 = brief_.BriefV4


class PipelineRequestedV4(PipelineRequestedV6):
    brief: BriefV4  # type: ignore[assignment]


class LyricCompletedV4(LyricCompleted):
    brief: BriefV4  # type: ignore[assignment]


class SongCompletedV5(SongCompleted):
    brief: BriefV4  # type: ignore[assignment]


# Before photos by URL (pipeline.requested, lyric.completed and video.completed up to v3, song.completed up to v4)
# a brief named uploads only, and song.completed told no bars; the versions after read each as it is.
BriefV3 = brief_.BriefV3


class PipelineRequestedV3(PipelineRequestedV6):
    brief: BriefV3  # type: ignore[assignment]


class LyricCompletedV3(LyricCompleted):
    brief: BriefV3  # type: ignore[assignment]


class VideoCompletedV3(VideoCompletedV4):
    brief: BriefV3  # type: ignore[assignment]


# Before photos (pipeline.requested, lyric.completed and video.completed up to v2, song.completed up to v3) a brief
# named none; the versions after read each such event as a brief without photos.
BriefV2 = brief_.BriefV2


class PipelineRequestedV2(PipelineRequestedV6):
    brief: BriefV2  # type: ignore[assignment]


class LyricCompletedV2(LyricCompleted):
    brief: BriefV2  # type: ignore[assignment]


class VideoCompletedV2(VideoCompletedV4):
    brief: BriefV2  # type: ignore[assignment]


# Version 1 of the events that carry a brief or lyrics knew fewer values: a genre from a fixed list and
# Korean or English only. Version 2 (free-text genre, four languages) reads every version-1 event as it is.
BriefV1 = brief_.BriefV1


class LyricsV1(Lyrics):
    language: brief_.V1Language  # type: ignore[assignment]


class PipelineRequestedV1(PipelineRequestedV2):
    brief: BriefV1


class LyricCompletedV1(LyricCompletedV2):
    brief: BriefV1
    lyrics: LyricsV1


class SongCompletedV1(SongCompletedV2):
    brief: BriefV1
    lyrics: LyricsV1


class VideoCompletedV1(VideoCompletedV2):
    brief: BriefV1
